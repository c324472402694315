"""``postbox queues list|pause|resume``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox import definitions
from postbox.app.admin.common import EXIT_OK, Parser, Session, UsageError, cli_actor, run, table, to_json
from postbox.app.services import queues as queue_service
from postbox.app.services.results import as_dict
from postbox.errors import TaskModuleError
from postbox.registry import default_registry, load_task_modules

COLUMNS = (
    "queue",
    "paused",
    "backlog",
    "scheduled",
    "queued",
    "in_flight",
    "retrying",
    "dead",
    "discarded",
    "oldest_waiting_seconds",
    "in_streams",
    "stream_pending",
)


def parser() -> Parser:
    p = Parser(prog="postbox queues", description="Queue stats and pause/resume.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="stats of every known queue (PostgreSQL exact, Redis approximate)")
    pause = sub.add_parser("pause", help="stop workers from starting this queue's jobs")
    pause.add_argument("queue")
    resume = sub.add_parser("resume", help="let workers start this queue's jobs again")
    resume.add_argument("queue")
    lst.add_argument(
        "--tasks", help="comma-separated task modules whose queues are listed before their first job (POSTBOX_TASKS)"
    )
    for each in (lst, pause, resume):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    # The API's list: the queues of the database's rows and task definitions, and of the
    # task modules it loads (POSTBOX_TASKS), so both list the same queues.
    modules = [m.strip() for m in a.tasks.split(",") if m.strip()] if a.tasks else s.settings.tasks
    try:
        load_task_modules(modules)
    except TaskModuleError as exc:
        raise UsageError(f"{exc}\n\n{exc.details}") from None
    known = await definitions.known_queues(s.conn, default_registry)
    stats = [
        as_dict(q)
        for q in await queue_service.queue_stats(s.conn, s.redis, s.settings.redis_prefix, extra_queues=known)
    ]
    if a.json:
        print(to_json(stats))
        return EXIT_OK
    table(stats, COLUMNS, sys.stdout)
    errors = {q["redis_error"] for q in stats if q["redis_error"]}
    if errors:
        print(f"\nredis unavailable ({'; '.join(sorted(errors))}): stream columns unknown", file=sys.stderr)
    return EXIT_OK


async def _set(s: Session, a: argparse.Namespace, paused: bool) -> int:
    outcome = as_dict(await queue_service.set_paused(s.conn, a.queue, paused, cli_actor()))
    print(to_json(outcome) if a.json else f"queue {a.queue} {'paused' if paused else 'resumed'}")
    return EXIT_OK


async def cmd_pause(s: Session, a: argparse.Namespace) -> int:
    return await _set(s, a, True)


async def cmd_resume(s: Session, a: argparse.Namespace) -> int:
    return await _set(s, a, False)


def main(argv: Sequence[str]) -> int:
    return run("postbox queues", parser(), argv, {"list": cmd_list, "pause": cmd_pause, "resume": cmd_resume})
