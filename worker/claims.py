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

import time
from collections.abc import Callable, Sequence
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


class Claimer:
    """:func:`claim` on a connection of the pool's kept for claims, or on the pool's next one while it is busy.

    A claim is on the path of every job from its commit to its handler, and at
    moderate rates each one is a batch of one: the pool's checkout and return
    around it were some 65 µs of that path at 200 jobs/s on the 2-vCPU machine
    of docs/benchmarks.md (seventeenth round), against 9 µs back to back. The
    kept connection goes back to the pool after a failed claim (the pool
    replaces a broken one) and every ``renew_after`` seconds (so the pool's
    ``max_lifetime`` still renews it), and at :meth:`close`.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        worker_id: str,
        lease: float,
        renew_after: float = 300.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._lease = lease
        self._renew_after = renew_after
        self._monotonic = monotonic
        self._conn: AsyncConnection[Any] | None = None
        self._taken_at = 0.0
        self._busy = False

    async def claim(self, deliveries: Sequence[Delivery]) -> ClaimBatch:
        if not deliveries:
            return ClaimBatch()
        if self._busy:  # another claim is under way on the kept connection
            return await claim(self._pool, deliveries, worker_id=self._worker_id, lease=self._lease)
        self._busy = True
        try:
            conn = self._conn
            if conn is not None and (conn.closed or self._monotonic() - self._taken_at >= self._renew_after):
                self._conn = None
                await self._pool.putconn(conn)
                conn = None
            if conn is None:
                conn = self._conn = await self._pool.getconn()
                self._taken_at = self._monotonic()
            try:
                return await claim_on(conn, deliveries, worker_id=self._worker_id, lease=self._lease)
            except BaseException:
                self._conn = None
                await self._pool.putconn(conn)  # checked there: a broken or busy one is replaced
                raise
        finally:
            self._busy = False

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.putconn(conn)


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
