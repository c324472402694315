"""``postbox schedules list|pause|resume|trigger``: periodic jobs from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox.app.admin.common import EXIT_OK, Parser, Session, cli_actor, run, table, to_json
from postbox.app.services import schedules as schedule_service
from postbox.app.services.results import as_dict

COLUMNS = (
    "name",
    "task",
    "expression",
    "tz",
    "catch_up",
    "paused",
    "removed",
    "next_run_at",
    "last_run_at",
    "last_job_id",
    "last_job_state",
)


def parser() -> Parser:
    p = Parser(prog="postbox schedules", description="Periodic jobs: list, pause, resume, trigger now.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="every schedule, removed ones flagged (times in UTC)")
    pause = sub.add_parser("pause", help="stop enqueueing this schedule's occurrences")
    resume = sub.add_parser("resume", help="enqueue again from now on (occurrences while paused are skipped)")
    trigger = sub.add_parser("trigger", help="enqueue one run of this schedule now")
    for each in (pause, resume, trigger):
        each.add_argument("name")
    for each in (lst, pause, resume, trigger):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    found = [as_dict(item) for item in await schedule_service.list_schedules(s.conn)]
    if a.json:
        print(to_json(found))
    else:
        table(found, COLUMNS, sys.stdout)
    return EXIT_OK


async def _set(s: Session, a: argparse.Namespace, paused: bool) -> int:
    outcome = as_dict(await schedule_service.set_paused(s.conn, a.name, paused, cli_actor()))
    print(to_json(outcome) if a.json else f"schedule {a.name} {'paused' if paused else 'resumed'}")
    return EXIT_OK


async def cmd_pause(s: Session, a: argparse.Namespace) -> int:
    return await _set(s, a, True)


async def cmd_resume(s: Session, a: argparse.Namespace) -> int:
    return await _set(s, a, False)


async def cmd_trigger(s: Session, a: argparse.Namespace) -> int:
    fired = as_dict(
        await schedule_service.trigger(s.conn, a.name, cli_actor(), redis=s.redis, prefix=s.settings.redis_prefix)
    )
    print(to_json(fired) if a.json else f"schedule {a.name}: job {fired['job_id']} enqueued")
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    return run(
        "postbox schedules",
        parser(),
        argv,
        {"list": cmd_list, "pause": cmd_pause, "resume": cmd_resume, "trigger": cmd_trigger},
    )
