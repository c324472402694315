"""``postbox jobs get|list|cancel|enqueue|move``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from postbox.app.admin.common import (
    EXIT_OK,
    Parser,
    Session,
    UsageError,
    cli_actor,
    positive_id,
    run,
    show_job,
    show_page,
    to_json,
)
from postbox.app.services import jobs as job_service
from postbox.app.services import moves
from postbox.app.services.events import publish_event
from postbox.app.services.results import as_dict
from postbox.errors import TaskModuleError, UnknownTaskError
from postbox.registry import default_registry, load_task_modules

LIST_COLUMNS = ("id", "task", "queue", "priority", "state", "attempts", "max_attempts", "created_at", "last_error")


def parser() -> Parser:
    p = Parser(prog="postbox jobs", description="Look up, list, cancel, enqueue and move jobs.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    get = sub.add_parser("get", help="one job with its attempt history")
    get.add_argument("id", type=positive_id)
    lst = sub.add_parser("list", help="jobs, newest first")
    lst.add_argument("--queue")
    lst.add_argument("--task")
    lst.add_argument("--state")
    lst.add_argument("--limit", type=int, default=50)
    lst.add_argument("--cursor", help="next_cursor of the previous page")
    cancel = sub.add_parser("cancel", help="cancel a job (waiting: now; running: cooperatively)")
    cancel.add_argument("id", type=positive_id)
    enq = sub.add_parser("enqueue", help="enqueue a job of a registered task")
    enq.add_argument("task")
    enq.add_argument("--args", default="{}", help="JSON object of the handler's arguments")
    enq.add_argument("--queue")
    enq.add_argument("--priority", type=int)
    enq.add_argument("--delay", type=float, help="seconds from now")
    enq.add_argument("--run-at", type=datetime.fromisoformat, help="ISO time with a timezone")
    enq.add_argument("--max-attempts", type=int)
    enq.add_argument("--dedup-key")
    enq.add_argument("--keep-result", action="store_true", default=None)
    enq.add_argument("--tasks", help="comma-separated task modules (default: POSTBOX_TASKS)")
    move = sub.add_parser(
        "move",
        help="change the priority or run time of waiting jobs (one by id, or all matching --queue/--task/--state)",
    )
    move.add_argument("id", type=positive_id, nargs="?", help="one job (else the filter)")
    move.add_argument("--queue")
    move.add_argument("--task")
    move.add_argument("--state", help="pending, queued or retrying")
    move.add_argument("--priority", type=int, help="the new priority, 0-9")
    move.add_argument("--delay", type=float, help="run this many seconds from now")
    move.add_argument("--run-at", type=datetime.fromisoformat, help="run at this ISO time with a timezone")
    move.add_argument("--limit", type=int, default=1000, help="move at most this many (a filter)")
    for each in (get, lst, cancel, enq, move):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_get(s: Session, a: argparse.Namespace) -> int:
    job = await job_service.get_job(s.conn, a.id)
    show_job(as_dict(job), a.json, sys.stdout)
    return EXIT_OK


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    page = await job_service.list_jobs(
        s.conn, queue=a.queue, task=a.task, state=a.state, limit=a.limit, cursor=a.cursor
    )
    show_page([as_dict(j) for j in page.items], page.next_cursor, LIST_COLUMNS, a.json, sys.stdout)
    return EXIT_OK


async def cmd_cancel(s: Session, a: argparse.Namespace) -> int:
    outcome = await job_service.cancel_job(s.conn, a.id, cli_actor())
    if not outcome.cancel_requested:
        await publish_event(
            s.redis, s.settings.redis_prefix, "cancelled", job_id=a.id, queue=outcome.queue, task=outcome.task
        )
    if a.json:
        print(to_json(as_dict(outcome)))
    elif outcome.cancel_requested:
        print(f"job {a.id} is running: cancel requested (its worker stops it)")
    else:
        print(f"job {a.id} cancelled")
    return EXIT_OK


def _args(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("--args must be a JSON object")
    return value


async def cmd_enqueue(s: Session, a: argparse.Namespace) -> int:
    modules = [m.strip() for m in a.tasks.split(",") if m.strip()] if a.tasks else s.settings.tasks
    try:
        load_task_modules(modules)
    except TaskModuleError as exc:
        raise UsageError(f"{exc}\n\n{exc.details}") from None
    if a.task not in default_registry:  # the CLI knows only the tasks of the modules it loaded
        loaded = ", ".join(modules) if modules else "none"
        raise UnknownTaskError(
            f"unknown task {a.task!r}: name the module that defines it with --tasks or POSTBOX_TASKS"
            f" (loaded: {loaded})",
            field="task",
        )
    done = await job_service.enqueue(
        s.conn,
        a.task,
        _args(a.args),
        registry=default_registry,
        queue=a.queue,
        priority=a.priority,
        delay=a.delay,
        run_at=a.run_at,
        max_attempts=a.max_attempts,
        dedup_key=a.dedup_key,
        keep_result=a.keep_result,
    )
    job_id, created, job = done.job.id, not done.duplicate, done.job
    if created:
        await publish_event(s.redis, s.settings.redis_prefix, "enqueued", job_id=job_id, queue=job.queue, task=job.task)
    if a.json:
        print(to_json({"id": job_id, "duplicate": not created, "queue": job.queue, "task": job.task}))
    else:
        print(f"job {job_id} {'enqueued' if created else 'already exists (dedup key)'} on queue {job.queue}")
    return EXIT_OK


async def cmd_move(s: Session, a: argparse.Namespace) -> int:
    change = {"priority": a.priority, "run_at": a.run_at, "delay": a.delay}
    if a.id is not None:
        if a.queue or a.task or a.state:
            raise UsageError("give a job id or a filter (--queue/--task/--state), not both")
        one = await moves.move_job(s.conn, a.id, cli_actor(), **change)
        result = moves.MoveResult(moved=[one], refused=[], more=False)
    else:
        result = await moves.move_jobs(
            s.conn, cli_actor(), queue=a.queue, task=a.task, state=a.state, limit=a.limit, **change
        )
    await moves.drop_old_entries(s.redis, s.settings.redis_prefix, result.moved)
    if a.json:
        print(to_json(as_dict(result)))
        return EXIT_OK
    for job in result.moved:
        print(
            f"job {job.id} moved: priority {job.old_priority} -> {job.priority},"
            f" due {job.old_available_at.isoformat()} -> {job.available_at.isoformat()}"
            + (" (published: goes back through the outbox)" if job.was_published else "")
        )
    if not result.moved:
        print("no waiting job matched")
    if result.more:
        print(f"\nmore may match: run the command again (--limit {a.limit})")
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    commands = {"get": cmd_get, "list": cmd_list, "cancel": cmd_cancel, "enqueue": cmd_enqueue, "move": cmd_move}
    return run("postbox jobs", parser(), argv, commands)
