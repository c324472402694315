"""``postbox relay run`` / ``python -m relay run``: one relay process.

Settings come from the environment (``POSTBOX_*``); a few can be overridden on
the command line. SIGTERM or SIGINT: finish the batch in hand, release the
leader lock, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from jobs import logs
from jobs.errors import SettingsError
from jobs.settings import Settings, load_settings

log = logging.getLogger("postbox.relay")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postbox relay", description="Publish committed outbox rows to Redis.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a relay (one leads, the others stand by)")
    run.add_argument("--batch-size", type=int, help="rows per publish batch (POSTBOX_RELAY_BATCH_SIZE)")
    run.add_argument("--poll-interval", type=float, help="seconds between polls (POSTBOX_POLL_INTERVAL)")
    run.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (POSTBOX_RELAY_METRICS_PORT)")
    run.add_argument("--relay-id", help="id of this relay in the relays table (default: random)")
    return parser


async def serve(settings: Settings, relay_id: str | None = None) -> int:
    from relay.service import Relay

    relay = Relay(settings, relay_id=relay_id)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stop)
    await relay.run()
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    overrides: dict[str, Any] = {}
    if args.batch_size is not None:
        overrides["relay_batch_size"] = args.batch_size
    if args.poll_interval is not None:
        overrides["poll_interval"] = args.poll_interval
    if args.metrics_port is not None:
        overrides["relay_metrics_port"] = args.metrics_port
    try:
        settings = load_settings(**overrides)
        settings.require_database_url()
        settings.require_redis_url()
    except SettingsError as exc:
        print(f"postbox relay: {exc}", file=sys.stderr)
        return 2
    logs.setup(json=settings.log_json, level=settings.log_level)
    try:
        import uvloop

        return uvloop.run(serve(settings, args.relay_id))
    except ImportError:
        return asyncio.run(serve(settings, args.relay_id))
