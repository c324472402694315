"""Claim a batch of deliveries in PostgreSQL (the contract's claim rule).

One statement per read: claimable rows move to ``running`` with the attempt
counted; rows that expired or used every attempt end at once; everything else
is skipped (acknowledged without running) — except a reclaimed entry whose job
is still running under a live claim, which stays pending for a later look. A
claimed row records the entry its run came in (what recovers the run if this
worker dies, even when the claim beat the relay's mark of that publish). A
job taken over from a lost run comes back with ``isolate``: the worker runs it
alone (see JOB_CLAIM_ATTEMPTS: a crash is charged to the job that caused it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from postbox import pgarray, sql
from postbox.worker.delivery import Delivery, Job


@dataclass
class ClaimBatch:
    run: list[Job] = field(default_factory=list)
    ended: list[tuple[Delivery, str]] = field(default_factory=list)  # (delivery, 'dead' | 'expired')
    skip: list[Delivery] = field(default_factory=list)  # acknowledge, do not run
    keep: list[Delivery] = field(default_factory=list)  # leave pending (running under a live claim)


async def claim(
    pool: AsyncConnectionPool[Any], deliveries: Sequence[Delivery], *, worker_id: str, lease: float
) -> ClaimBatch:
    if not deliveries:
        return ClaimBatch()
    async with pool.connection() as conn:
        return await claim_on(conn, deliveries, worker_id=worker_id, lease=lease)


async def claim_on(
    conn: AsyncConnection[Any], deliveries: Sequence[Delivery], *, worker_id: str, lease: float
) -> ClaimBatch:
    """:func:`claim` on a given connection (inside the flow-control claim's transaction)."""
    batch = ClaimBatch()
    if not deliveries:
        return batch
    entries: dict[int, str | None] = {}
    for delivery in deliveries:  # the first delivery of a job is the one that runs
        entry = delivery.entry_id
        entries.setdefault(delivery.job_id, (entry.decode() if isinstance(entry, bytes) else str(entry)) or None)
    ids = sorted(entries)
    cur = await conn.execute(
        sql.active().JOB_CLAIM_ATTEMPTS,
        {
            "ids": pgarray.ints(ids),
            "entries": pgarray.words_or_null(entries[i] for i in ids),
            "worker": worker_id,
            "lease": lease,
        },
    )
    rows = {row[0]: row for row in await cur.fetchall()}
    running: set[int] = set()
    reclaimed_left = [d.job_id for d in deliveries if d.reclaimed and d.job_id not in rows]
    if reclaimed_left:
        cur = await conn.execute(sql.active().JOB_GET_RUNNING, {"ids": reclaimed_left})
        running = {row[0] for row in await cur.fetchall()}
    ended = [job_id for job_id, row in rows.items() if row[1] != "running"]
    if ended:
        await conn.execute(sql.active().RESULTS_NOTIFY, {"ids": pgarray.ints(ended)})
    for delivery in deliveries:
        row = rows.pop(delivery.job_id, None)  # a job delivered twice in one read runs once
        if row is None:
            if delivery.reclaimed and delivery.job_id in running:
                batch.keep.append(delivery)
            else:
                batch.skip.append(delivery)
            continue
        _, state, attempts, max_attempts, timeout, keep_result, enq_ms, isolate = row
        if state == "running":
            batch.run.append(Job(delivery, attempts, max_attempts, timeout, keep_result, enq_ms, isolate=isolate))
        else:
            batch.ended.append((delivery, state))
    return batch
