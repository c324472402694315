"""Jobs this worker cannot run: handed back, then dead-lettered after a grace period.

During a rolling deploy a job can reach a worker that runs the previous code:
it has no handler for the job's task, or its handler refuses the job's args
(a parameter added by the newer code). Such a job is not claimed: it is handed back
(:data:`sql.JOB_HAND_BACK`) — made publishable again after a short delay,
its attempts untouched — so the relay publishes it anew and a worker that
knows the task can take it. Once this worker has seen the job for longer than
``POSTBOX_UNKNOWN_TASK_GRACE`` seconds it stops handing it back: the job is
claimed and sent to the dead letters with an ``UnknownTaskError`` (or the
``InvalidArgsError``) that says so.
The first-seen times live in this worker's memory (bounded; a restarted worker
starts counting again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from psycopg_pool import AsyncConnectionPool

from postbox import pgarray, sql
from postbox.worker.delivery import Delivery

MAX_HAND_BACK_DELAY = 5.0
MAX_REMEMBERED = 100_000


class UnknownTasks:
    def __init__(self, grace: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self._clock = clock
        self._first_seen: dict[int, float] = {}

    @property
    def delay(self) -> float:
        """Seconds before a handed-back job is published again."""
        return max(0.05, min(MAX_HAND_BACK_DELAY, self.grace / 4))

    def split(self, deliveries: Sequence[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """(deliveries to hand back, deliveries past the grace period: to end in the dead letters)."""
        now = self._clock()
        if len(self._first_seen) > MAX_REMEMBERED:
            horizon = now - 2 * self.grace - self.delay
            self._first_seen = {k: v for k, v in self._first_seen.items() if v >= horizon}
        back: list[Delivery] = []
        expired: list[Delivery] = []
        for delivery in deliveries:
            first = self._first_seen.setdefault(delivery.job_id, now)
            if now - first >= self.grace:
                expired.append(delivery)
                self._first_seen.pop(delivery.job_id, None)
            else:
                back.append(delivery)
        return back, expired


async def hand_back(
    pool: AsyncConnectionPool[Any],
    deliveries: Sequence[Delivery],
    *,
    worker_id: str,
    delay: float,
    error_class: str = "UnknownTaskError",
    reason: str = "task %s is not registered on {worker}; handed back for a worker that knows it",
) -> tuple[set[int], set[int]]:
    """Make these jobs publishable again after ``delay``.

    Returns (ids handed back, ids whose publish is not marked yet: their entries
    must stay pending and be looked at again). Other jobs (finished, running
    under a live claim, not due) have nothing to hand back.
    """
    ids = sorted({d.job_id for d in deliveries})
    async with pool.connection() as conn:
        cur = await conn.execute(
            sql.active().JOB_HAND_BACK,
            {
                "ids": pgarray.ints(ids),
                "delay": delay,
                "error_class": error_class,
                "reason": reason.format(worker=worker_id),
            },
        )
        rows = await cur.fetchall()
    return {row[0] for row in rows if row[1]}, {row[0] for row in rows if not row[1]}
