"""Liveness: the workers registry row, lease renewal, and fresh idle times.

Every tick the worker renews ``lease_until`` of the jobs it runs (only those
still its own) and resets their stream entries' idle time with XCLAIM JUSTID,
so XAUTOCLAIM only ever takes entries of dead or stalled workers. The row in
``workers`` (host, pid, in flight, processed, failed, last seen) is what the
API lists; staleness is computed by the reader from ``last_seen``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from postbox import sql
from postbox.redis_conn import AnyRedis
from postbox.streams import GROUP
from postbox.worker.delivery import Delivery, Job

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        redis: AnyRedis,
        *,
        worker_id: str,
        queues: list[str],
        concurrency: int,
        lease: float,
    ) -> None:
        self._pool = pool
        self._redis = redis
        self._worker_id = worker_id
        self._queues = queues
        self._concurrency = concurrency
        self._lease = lease

    async def beat(self, in_flight: int, processed: int, failed: int) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                sql.active().WORKER_UPSERT,
                {
                    "id": self._worker_id,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "queues": self._queues,
                    "concurrency": self._concurrency,
                    "in_flight": in_flight,
                    "processed": processed,
                    "failed": failed,
                },
            )

    async def renew(self, jobs: Iterable[Job]) -> int:
        """Renew the leases of running jobs still ours and refresh their entries' idle time."""
        by_id = {job.id: job for job in jobs}
        if not by_id:
            return 0
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                sql.active().JOB_RENEW_LEASES, {"ids": list(by_id), "worker": self._worker_id, "lease": self._lease}
            )
            ours = [row[0] for row in await cur.fetchall()]
        entries: dict[str, list[Any]] = defaultdict(list)
        for job_id in ours:
            if by_id[job_id].delivery.entry_id:  # (none for a job taken straight from its parking)
                entries[by_id[job_id].delivery.stream].append(by_id[job_id].delivery.entry_id)
        if entries:
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, ids in entries.items():
                    pipe.xclaim(stream, GROUP, self._worker_id, 0, ids, justid=True)
                await pipe.execute(raise_on_error=False)
        return len(ours)

    async def touch(self, deliveries: Iterable[Delivery]) -> None:
        """Refresh the idle time of entries this worker holds while their jobs wait here (flow control)."""
        entries: dict[str, list[Any]] = defaultdict(list)
        for delivery in deliveries:
            if delivery.entry_id:
                entries[delivery.stream].append(delivery.entry_id)
        if entries:
            async with self._redis.pipeline(transaction=False) as pipe:
                for stream, ids in entries.items():
                    pipe.xclaim(stream, GROUP, self._worker_id, 0, ids, justid=True)
                await pipe.execute(raise_on_error=False)

    async def stopped(self, processed: int, failed: int) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                sql.active().WORKER_SET_STOPPED, {"id": self._worker_id, "processed": processed, "failed": failed}
            )
