"""Workers as operators see them: the heartbeat registry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services.checks import check_text
from postbox.app.services.errors import NotFoundError


@dataclass(frozen=True)
class WorkerInfo:
    """One registered worker; ``stale`` when last seen over 3 heartbeat intervals ago and not stopped."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen: datetime
    in_flight: int
    processed: int
    failed: int
    stopped_at: datetime | None
    stale: bool
    age_seconds: float
    stopped: bool


async def list_workers(
    conn: AsyncConnection[Any], *, heartbeat_interval: float, worker_id: str | None = None
) -> list[WorkerInfo]:
    """Registered workers, newest first."""
    if worker_id is not None:
        check_text(worker_id, "worker_id")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().WORKER_LIST, {"heartbeat": heartbeat_interval, "id": worker_id})
        rows = await cur.fetchall()
    return [
        WorkerInfo(
            **{
                **row,
                "queues": list(row["queues"] or []),
                "stale": bool(row["stale"]) and row["stopped_at"] is None,
                "stopped": row["stopped_at"] is not None,
            }
        )
        for row in rows
    ]


async def get_worker(conn: AsyncConnection[Any], worker_id: str, *, heartbeat_interval: float) -> WorkerInfo:
    found = await list_workers(conn, heartbeat_interval=heartbeat_interval, worker_id=worker_id)
    if not found:
        raise NotFoundError(f"worker {worker_id!r} not found", details={"id": worker_id})
    return found[0]
