"""``postbox dlq list|show|requeue|discard|purge``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from postbox.app.admin.common import (
    EXIT_FAILED,
    EXIT_OK,
    Parser,
    Session,
    cli_actor,
    parse_duration,
    positive_id,
    run,
    show_job,
    show_page,
    to_json,
)
from postbox.app.services import dlq
from postbox.app.services.errors import ConfirmationRequiredError
from postbox.app.services.results import as_dict

LIST_COLUMNS = ("id", "task", "queue", "attempts", "finished_at", "discarded", "last_error_class", "last_error")


def parser() -> Parser:
    p = Parser(prog="postbox dlq", description="Dead letters: inspect, requeue, discard, purge.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="dead letters, newest first")
    lst.add_argument("--queue")
    lst.add_argument("--task")
    which = lst.add_mutually_exclusive_group()
    which.add_argument("--discarded", dest="discarded", action="store_true", default=None, help="only discarded")
    which.add_argument("--not-discarded", dest="discarded", action="store_false", help="only not discarded")
    lst.add_argument("--limit", type=int, default=50)
    lst.add_argument("--cursor")
    show = sub.add_parser("show", help="one dead letter: error and attempt history")
    show.add_argument("id", type=positive_id)
    requeue = sub.add_parser("requeue", help="run it again (attempts reset, history kept)")
    requeue.add_argument("id", type=positive_id)
    discard = sub.add_parser("discard", help="mark it discarded (kept until purged)")
    discard.add_argument("id", type=positive_id)
    purge = sub.add_parser("purge", help="delete a queue's dead letters older than an age, for good")
    purge.add_argument("--queue", required=True)
    purge.add_argument("--older-than", type=parse_duration, required=True, help="age: seconds or 30m, 12h, 7d")
    purge.add_argument("--discarded-only", action="store_true", help="only dead letters already discarded")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    for each in (lst, show, requeue, discard, purge):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    page = await dlq.list_dead(
        s.conn, queue=a.queue, task=a.task, discarded=a.discarded, limit=a.limit, cursor=a.cursor
    )
    show_page([as_dict(j) for j in page.items], page.next_cursor, LIST_COLUMNS, a.json, sys.stdout)
    return EXIT_OK


async def cmd_show(s: Session, a: argparse.Namespace) -> int:
    job = await dlq.get_dead(s.conn, a.id)
    show_job(as_dict(job), a.json, sys.stdout)
    return EXIT_OK


async def cmd_requeue(s: Session, a: argparse.Namespace) -> int:
    outcome = as_dict(await dlq.requeue_dead(s.conn, a.id, cli_actor()))
    resumed = outcome["resumed"]
    waiting = f"; {len(resumed)} job(s) of its workflow wait for it again: {resumed}" if resumed else ""
    print(to_json(outcome) if a.json else f"job {a.id} requeued (state pending, attempts reset){waiting}")
    return EXIT_OK


async def cmd_discard(s: Session, a: argparse.Namespace) -> int:
    outcome = as_dict(await dlq.discard_dead(s.conn, a.id, cli_actor()))
    print(to_json(outcome) if a.json else f"job {a.id} discarded (kept until purged)")
    return EXIT_OK


async def cmd_purge(s: Session, a: argparse.Namespace) -> int:
    actor = cli_actor()
    if not a.yes:
        count = 0
        try:
            await dlq.purge_dead(
                s.conn, a.queue, older_than=a.older_than, confirm=False, actor=actor, discarded_only=a.discarded_only
            )
        except ConfirmationRequiredError as exc:
            count = int(exc.details.get("would_purge", 0))
        if count == 0:
            print(to_json({"queue": a.queue, "purged": 0}) if a.json else "nothing to purge")
            return EXIT_OK
        if not sys.stdin.isatty():
            print(
                f"postbox dlq: error: purge would delete {count} dead letters of {a.queue!r}; "
                "no terminal to confirm on: pass --yes",
                file=sys.stderr,
            )
            return EXIT_FAILED
        answer = await asyncio.to_thread(input, f"Delete {count} dead letters of queue {a.queue!r} for good? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("aborted; nothing deleted", file=sys.stderr)
            return EXIT_FAILED
    outcome = as_dict(
        await dlq.purge_dead(
            s.conn, a.queue, older_than=a.older_than, confirm=True, actor=actor, discarded_only=a.discarded_only
        )
    )
    print(to_json(outcome) if a.json else f"purged {outcome['purged']} dead letters of queue {a.queue}")
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    commands = {"list": cmd_list, "show": cmd_show, "requeue": cmd_requeue, "discard": cmd_discard, "purge": cmd_purge}
    return run("postbox dlq", parser(), argv, commands)
