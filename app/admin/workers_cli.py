"""``postbox workers list``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox.app.admin.common import EXIT_OK, Parser, Session, run, table, to_json
from postbox.app.services import workers as worker_service
from postbox.app.services.results import as_dict

COLUMNS = (
    "id",
    "host",
    "pid",
    "queues",
    "concurrency",
    "in_flight",
    "processed",
    "failed",
    "age_seconds",
    "stale",
    "stopped",
)


def parser() -> Parser:
    p = Parser(prog="postbox workers", description="The worker heartbeat registry.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="workers; stale = no heartbeat for over 3 intervals")
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    listed = await worker_service.list_workers(s.conn, heartbeat_interval=s.settings.heartbeat_interval)
    found = [as_dict(w) for w in listed]
    if a.json:
        print(to_json(found))
    else:
        table(found, COLUMNS, sys.stdout)
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    return run("postbox workers", parser(), argv, {"list": cmd_list})
