"""``postbox relay run`` / ``python -m postbox.relay run``: one relay process.

Settings come from the environment (``POSTBOX_*``); a few can be overridden on
the command line. SIGTERM or SIGINT: finish the batch in hand, release the
leader lock, exit 0.

Exit 2 at start, with one line, on bad settings, a task module that does not
import, PostgreSQL or Redis not answering within ``POSTBOX_START_TIMEOUT``, or a
schema older than this code (run ``postbox migrate``); the same if the schema
disappears under a running relay (:class:`~postbox.errors.SchemaOutdatedError`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from postbox import revision, schedule_store
from postbox.errors import SchemaOutdatedError, TaskModuleError
from postbox.periodic import default_schedules
from postbox.registry import default_registry, load_task_modules
from postbox.settings import Settings
from postbox.startup import process_settings, run_loop, settle_collector

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postbox relay", description="Publish committed outbox rows to Redis.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a relay (one leads, the others stand by)")
    run.add_argument("--batch-size", type=int, help="rows per publish batch (POSTBOX_RELAY_BATCH_SIZE)")
    run.add_argument("--poll-interval", type=float, help="seconds between polls (POSTBOX_POLL_INTERVAL)")
    run.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (POSTBOX_RELAY_METRICS_PORT)")
    run.add_argument("--relay-id", help="id of this relay in the relays table (default: random)")
    run.add_argument(
        "--tasks", help="comma-separated modules whose @task handlers and schedules are loaded (POSTBOX_TASKS)"
    )
    return parser


async def serve(settings: Settings, relay_id: str | None = None) -> int:
    from postbox.relay.service import Relay

    # A schema older than this code: refuse before the schedules' sync writes anything.
    await revision.require_at(settings.require_database_url())
    # Periodic jobs follow the code: the schedules of POSTBOX_TASKS' modules (docs/periodic-jobs.md).
    await schedule_store.sync_at_start(settings.require_database_url(), default_schedules, default_registry)
    relay = Relay(settings, relay_id=relay_id)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stop)
    settle_collector(settings.gc_threshold)
    await relay.run()
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    settings = process_settings(
        "relay",
        relay_batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        relay_metrics_port=args.metrics_port,
        tasks=args.tasks,
    )
    if settings is None:
        return 2
    try:
        load_task_modules(settings.tasks)
    except TaskModuleError as exc:
        print(f"{exc.details}\npostbox relay: {exc}", file=sys.stderr)
        return 2
    try:
        return run_loop(serve(settings, args.relay_id))
    except SchemaOutdatedError as exc:
        print(f"postbox relay: {exc}", file=sys.stderr)
        return 2
