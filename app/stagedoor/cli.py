"""``postbox stagedoor``: the example application's own migration step and API process.

- ``postbox stagedoor migrate`` brings postbox's schema up to date (as
  ``postbox migrate``), then creates Stagedoor's tables in their own
  ``stagedoor`` schema: what an application's deploy step does;
- ``postbox stagedoor api run`` serves postbox's API plus Stagedoor's
  ``/api/v1/events`` and ``/api/v1/orders``: the demo's API process. A plain
  ``postbox api run`` serves postbox's operations surface only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastapi import FastAPI

from postbox import migrate
from postbox.app import api_cli
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings


def create_demo_app(settings: Settings) -> FastAPI:
    from postbox.app.api.main import create_app
    from postbox.app.stagedoor.routes import router

    return create_app(settings, routers=[router])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="postbox stagedoor", description="The Stagedoor example's own processes.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="postbox's schema, then the schema stagedoor")
    api = sub.add_parser("api", help="postbox's API with the example's endpoints")
    api.add_argument("api_command", choices=["run"])
    api.add_argument("--host", help="address to bind (default: POSTBOX_API_HOST, 127.0.0.1)")
    api.add_argument("--port", type=int, help="port to bind (default: POSTBOX_API_PORT, 8000)")
    api.add_argument("--tasks", help="comma-separated task modules (default: POSTBOX_TASKS)")
    return p


def main(argv: Sequence[str]) -> int:
    try:
        args = parser().parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "api":
        return api_cli.serve_parsed(args, "postbox stagedoor api", create_demo_app)
    from postbox.app.stagedoor import schema

    try:
        url = load_settings().require_database_url()
    except SettingsError as exc:
        print(f"postbox stagedoor migrate: {exc}", file=sys.stderr)
        return 2
    migrate.upgrade(url)
    schema.migrate(url)
    print("postbox stagedoor migrate: schemas postbox and stagedoor are ready")
    return 0
