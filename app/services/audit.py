"""The audit log: who ran which destructive operation, written in the operation's own transaction."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services.checks import check_limit, decode_cursor, encode_cursor
from postbox.app.services.results import Page, page

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Actor:
    """Who runs a destructive operation (for the audit table and the log)."""

    name: str
    request_id: str | None = None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    request_id: str | None
    details: dict[str, Any]


async def record_audit(
    conn: AsyncConnection[Any], actor: Actor, action: str, target: str, details: Mapping[str, Any] | None = None
) -> None:
    """Append one audit row (in the caller's transaction) and log it."""
    await conn.execute(
        sql.active().AUDIT_INSERT,
        {
            "actor": actor.name,
            "action": action,
            "target": target,
            "request_id": actor.request_id,
            "details": orjson.dumps(dict(details or {})).decode(),
        },
    )
    log.info(
        "audit %s %s",
        action,
        target,
        extra={"actor": actor.name, "action": action, "target": target, "request_id": actor.request_id},
    )


async def list_audit(conn: AsyncConnection[Any], *, limit: int = 50, cursor: str | None = None) -> Page[AuditEntry]:
    """Audit entries, newest first."""
    params = {"limit": check_limit(limit) + 1, "before": decode_cursor(cursor)}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().AUDIT_LIST, params)
        rows = await cur.fetchall()
    return page([AuditEntry(**row) for row in rows], limit, lambda e: e.id, encode_cursor)
