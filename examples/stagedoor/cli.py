"""``stagedoor migrate`` and ``stagedoor api run``: the example application's own migration step and API process.

- ``stagedoor migrate`` brings postbox's schema up to date (as
  ``postbox migrate``), then creates Stagedoor's tables in their own
  ``stagedoor`` schema: what an application's deploy step does;
- ``stagedoor api run`` serves postbox's API plus Stagedoor's
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
    from postbox_examples.stagedoor.routes import router

    return create_app(settings, routers=[router])


def migrate_main(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(
        prog="stagedoor migrate", description="postbox's schema, then the schemas stagedoor and dtq"
    ).parse_args(list(argv))
    from postbox_examples.dtq import schema as dtq_schema
    from postbox_examples.stagedoor import schema

    try:
        url = load_settings().require_database_url()
    except SettingsError as exc:
        print(f"stagedoor migrate: {exc}", file=sys.stderr)
        return 2
    migrate.upgrade(url)
    schema.migrate(url)
    dtq_schema.migrate(url)
    print("stagedoor migrate: schemas postbox, stagedoor and dtq are ready")
    return 0


def api_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="stagedoor api", description="postbox's API with the example's endpoints")
    p.add_argument("api_command", choices=["run"])
    p.add_argument("--host", help="address to bind (default: POSTBOX_API_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default: POSTBOX_API_PORT, 8000)")
    p.add_argument("--tasks", help="comma-separated task modules (default: POSTBOX_TASKS)")
    try:
        args = p.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return api_cli.serve_parsed(args, "stagedoor api", create_demo_app)
