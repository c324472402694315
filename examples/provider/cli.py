"""``stagedoor provider run``: the example mail provider as its own process."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from postbox import logs
from postbox.errors import SettingsError
from postbox.settings import libpq_url, load_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stagedoor provider", description="The example mail provider (HTTP).")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve POST/GET /v1/messages")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8025)
    run.add_argument("--database-url", default=None, help="default: POSTBOX_DATABASE_URL / DATABASE_URL")
    run.add_argument(
        "--fail-after-delivery", type=float, default=0.0, metavar="P", help="deliver, then answer 500 (probability)"
    )
    run.add_argument(
        "--stall-after-delivery",
        type=float,
        default=0.0,
        metavar="P",
        help="deliver, then hold the answer for --stall-seconds (probability)",
    )
    run.add_argument("--stall-seconds", type=float, default=30.0)
    run.add_argument("--seed", type=int, default=None, help="seed of the misbehaviour draws (reproducible runs)")
    run.add_argument("--log-level", default="WARNING")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    import uvicorn

    from postbox_examples.provider.app import create_app
    from postbox_examples.provider.faults import Faults, seeded

    try:
        url = args.database_url or load_settings().require_database_url()
        faults = Faults(args.fail_after_delivery, args.stall_after_delivery, args.stall_seconds)
    except (SettingsError, ValueError) as exc:
        print(f"stagedoor provider: {exc}")
        return 2
    logs.setup(level=args.log_level.upper())
    app = create_app(libpq_url(url), faults, seeded(args.seed))
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    return 0
