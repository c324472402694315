"""``postbox workflows list|get|cancel|retry``: workflows from the command line (docs/workflows.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox.app.admin.common import EXIT_OK, Parser, Session, cli_actor, run, table, to_json
from postbox.app.services import workflows as workflow_service
from postbox.app.services.results import as_dict

COLUMNS = ("id", "name", "status", "jobs", "done", "created_at", "finished_at")
JOB_COLUMNS = ("id", "task", "queue", "state", "attempts", "waiting_on", "upstream", "last_error_class")


def parser() -> Parser:
    p = Parser(prog="postbox workflows", description="Workflows: list, get, cancel, retry.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="workflows, newest first (times in UTC)")
    lst.add_argument("--status", choices=workflow_service.STATUSES)
    lst.add_argument("--name")
    lst.add_argument("--limit", type=int, default=50)
    lst.add_argument("--cursor")
    get = sub.add_parser("get", help="one workflow: its jobs, their states, their upstream jobs")
    cancel = sub.add_parser("cancel", help="cancel every job not started; ask the running ones to stop")
    retry = sub.add_parser("retry", help="run its dead, cancelled and expired jobs again, and resume")
    for each in (get, cancel, retry):
        each.add_argument("id", type=int)
    for each in (lst, get, cancel, retry):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _done(counts: dict[str, int]) -> str:
    ended = sum(counts.get(state, 0) for state in ("succeeded", "dead", "cancelled", "expired"))
    return f"{ended}/{sum(counts.values())}"


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    found = as_dict(
        await workflow_service.list_workflows(s.conn, status=a.status, name=a.name, limit=a.limit, cursor=a.cursor)
    )
    if a.json:
        print(to_json(found))
    else:
        table([{**item, "done": _done(item["counts"])} for item in found["items"]], COLUMNS, sys.stdout)
        if found["next_cursor"]:
            print(f"more: --cursor {found['next_cursor']}")
    return EXIT_OK


async def cmd_get(s: Session, a: argparse.Namespace) -> int:
    detail = as_dict(await workflow_service.get_workflow(s.conn, a.id))
    if a.json:
        print(to_json(detail))
        return EXIT_OK
    w = detail["workflow"]
    print(
        f"workflow {w['id']} {w['name']}: {w['status']}, {_done(w['counts'])} jobs ended (on_failure {w['on_failure']})"
    )
    upstream: dict[int, list[str]] = {}
    for edge in detail["edges"]:
        upstream.setdefault(edge["child"], []).append(str(edge["parent"]))
    rows = [{**job, "upstream": ",".join(upstream.get(job["id"], [])) or "-"} for job in detail["jobs"]]
    table(rows, JOB_COLUMNS, sys.stdout)
    return EXIT_OK


async def _change(s: Session, a: argparse.Namespace, retry: bool) -> int:
    if retry:
        change = as_dict(await workflow_service.retry_workflow(s.conn, a.id, cli_actor()))
        text = f"workflow {a.id}: {len(change['retried'])} jobs to run again"
    else:
        change = as_dict(await workflow_service.cancel_workflow(s.conn, a.id, cli_actor()))
        text = f"workflow {a.id}: {len(change['cancelled'])} jobs cancelled, {len(change['stopping'])} asked to stop"
    print(to_json(change) if a.json else text)
    return EXIT_OK


async def cmd_cancel(s: Session, a: argparse.Namespace) -> int:
    return await _change(s, a, False)


async def cmd_retry(s: Session, a: argparse.Namespace) -> int:
    return await _change(s, a, True)


def main(argv: Sequence[str]) -> int:
    return run(
        "postbox workflows",
        parser(),
        argv,
        {"list": cmd_list, "get": cmd_get, "cancel": cmd_cancel, "retry": cmd_retry},
    )
