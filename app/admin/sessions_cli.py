"""``postbox sessions list|revoke``: the dashboard's login sessions (postbox.app.services.sessions)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox.app.admin.common import EXIT_FAILED, EXIT_OK, Parser, Session, UsageError, cli_actor, run, table, to_json
from postbox.app.services import sessions
from postbox.app.services.audit import record_audit
from postbox.app.services.results import as_dict

COLUMNS = ("id", "client", "created_at", "last_seen_at", "expires_at", "valid", "user_agent")


def parser() -> Parser:
    p = Parser(prog="postbox sessions", description="Dashboard login sessions: list and revoke.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="unexpired sessions, newest first (valid=false: made with an older key)")
    revoke = sub.add_parser("revoke", help="end one session (by id), or every one with --all")
    revoke.add_argument("id", nargs="?", type=int, help="the session's id (sessions list)")
    revoke.add_argument("--all", action="store_true", help="end every session")
    for each in (lst, revoke):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    found = [as_dict(item) for item in await sessions.list_sessions(s.conn, s.settings.api_key)]
    await s.conn.rollback()
    if a.json:
        print(to_json(found))
    else:
        table(found, COLUMNS, sys.stdout)
    return EXIT_OK


async def cmd_revoke(s: Session, a: argparse.Namespace) -> int:
    if (a.id is None) == (not a.all):
        raise UsageError("give a session id or --all (not both)")
    async with s.conn.transaction():
        if a.all:
            count = await sessions.revoke_all(s.conn)
            await record_audit(s.conn, cli_actor(), "session.revoke_all", "sessions", {"revoked": count})
        else:
            count = 1 if await sessions.revoke(s.conn, a.id) else 0
            if count:
                await record_audit(s.conn, cli_actor(), "session.revoke", f"session:{a.id}")
    if a.json:
        print(to_json({"revoked": count}))
    elif a.all or count:
        print(f"{count} session(s) ended")
    else:
        print(f"postbox sessions: error: no session {a.id}", file=sys.stderr)
    return EXIT_OK if a.all or count else EXIT_FAILED


def main(argv: Sequence[str]) -> int:
    return run("postbox sessions", parser(), argv, {"list": cmd_list, "revoke": cmd_revoke})
