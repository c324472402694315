"""Operator control as the worker sees it: paused queues and cancel requests.

Both live in PostgreSQL (``queues.paused``, ``outbox.cancel_requested_at``);
the worker polls them every second, well within the 2 s the contract allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg_pool import AsyncConnectionPool

from postbox import sql

POLL_INTERVAL = 1.0


async def poll(
    pool: AsyncConnectionPool[Any], queues: Sequence[str], running: Iterable[int]
) -> tuple[set[str], set[int]]:
    """(paused queues among ``queues``, running job ids whose cancel was requested)."""
    ids = list(running)
    async with pool.connection() as conn:
        cur = await conn.execute(sql.active().QUEUE_GET_PAUSED, {"queues": list(queues)})
        paused = {row[0] for row in await cur.fetchall()}
        cancel: set[int] = set()
        if ids:
            cur = await conn.execute(sql.active().JOB_GET_CANCEL_REQUESTED, {"ids": ids})
            cancel = {row[0] for row in await cur.fetchall()}
    return paused, cancel
