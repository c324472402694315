"""``postbox queues list|pause|resume|fair|unfair|fairness``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox import definitions
from postbox.app.admin.common import EXIT_OK, Parser, Session, UsageError, cli_actor, run, table, to_json
from postbox.app.services import fairness as fairness_service
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
    fair = sub.add_parser("fair", help="serve this queue's jobs by an argument's values in turn (docs/job-control.md)")
    fair.add_argument("queue")
    fair.add_argument("--by", required=True, help="the argument whose value keys a job (e.g. tenant_id)")
    fair.add_argument("--window", type=int, help="jobs published and unfinished at most (default POSTBOX_FAIR_WINDOW)")
    unfair = sub.add_parser("unfair", help="serve this queue in enqueue order again")
    unfair.add_argument("queue")
    show = sub.add_parser("fairness", help="a fair queue's window and its keys with the most jobs waiting")
    show.add_argument("queue")
    show.add_argument("--keys", type=int, default=20, help="keys shown (default 20)")
    for each in (lst, pause, resume, fair, unfair, show):
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


async def cmd_fair(s: Session, a: argparse.Namespace) -> int:
    found = await fairness_service.declare(
        s.conn, a.queue, a.by, a.window, cli_actor(), default_window=s.settings.fair_window
    )
    print(to_json(as_dict(found)) if a.json else f"queue {a.queue} fair by {a.by}, window {found.window_in_force}")
    return EXIT_OK


async def cmd_unfair(s: Session, a: argparse.Namespace) -> int:
    was = await fairness_service.clear(s.conn, a.queue, cli_actor())
    text = f"queue {a.queue} served in enqueue order" + ("" if was else " (it was not fair)")
    print(to_json({"queue": a.queue, "was_fair": was}) if a.json else text)
    return EXIT_OK


async def cmd_fairness(s: Session, a: argparse.Namespace) -> int:
    found = await fairness_service.get(s.conn, a.queue, default_window=s.settings.fair_window, keys=a.keys)
    if a.json:
        print(to_json(as_dict(found)))
        return EXIT_OK
    print(
        f"queue {found.queue}: fair by {found.by}, window {found.window_in_force}"
        f" ({found.in_flight} in flight, {found.waiting} waiting, {found.unkeyed} not keyed yet)"
    )
    table([as_dict(k) for k in found.keys], ("key", "waiting", "in_flight"), sys.stdout)
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    return run(
        "postbox queues",
        parser(),
        argv,
        {
            "list": cmd_list,
            "pause": cmd_pause,
            "resume": cmd_resume,
            "fair": cmd_fair,
            "unfair": cmd_unfair,
            "fairness": cmd_fairness,
        },
    )
