"""Jobs this worker cannot run: handed back, then dead-lettered after a grace period.

During a rolling deploy a job can reach a worker that runs the previous code:
it has no handler for the job's task, or its handler refuses the job's args
(a parameter added by the newer code). Such a job is not claimed: it is handed back
(:data:`~postbox.sql.Statements.JOB_HAND_BACK`) — made publishable again after a short delay,
its attempts untouched — so the relay publishes it anew and a worker that
knows the task can take it. Once this worker has seen the job for longer than
``POSTBOX_UNKNOWN_TASK_GRACE`` seconds it stops handing it back: the job is
claimed and sent to the dead letters with an ``UnknownTaskError`` (or the
``InvalidArgsError``) that says so.
The first-seen times live in this worker's memory (bounded; a restarted worker
starts counting again).

:class:`Handback` is the step of a read's dispatch that does this, before the
claim (:mod:`postbox.worker.worker` constructs it); :class:`UnknownTasks` keeps
the first-seen times and :func:`hand_back` runs the statement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from psycopg_pool import AsyncConnectionPool

from postbox import pgarray, sql
from postbox.registry import Registry
from postbox.worker.delivery import Delivery

log = logging.getLogger(__name__)

MAX_HAND_BACK_DELAY = 5.0
MAX_REMEMBERED = 100_000

UNKNOWN_REASON = "task %s is not registered on {worker}; handed back for a worker that knows it"
REFUSED_REASON = (
    "the args of task %s are refused by its handler on {worker}; handed back for a worker that accepts them"
)


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
    reason: str = UNKNOWN_REASON,
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


class Handback:
    """Screens a read's deliveries before their claim: those this worker cannot run are handed back.

    ``arguments`` validates a delivery's args for its handler (the executor's),
    returning the handler's keyword arguments or the exception refusing them;
    ``on_skipped`` is told of every delivery whose stream entry may now be
    acknowledged (handed back, or nothing left to hand back).
    """

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        registry: Registry,
        arguments: Callable[[Delivery], dict[str, Any] | Exception],
        worker_id: str,
        grace: float,
        on_skipped: Callable[[Delivery], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._registry = registry
        self._arguments = arguments
        self._worker_id = worker_id
        self._on_skipped = on_skipped
        self.unknown = UnknownTasks(grace, clock=clock)

    async def screen(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries to claim; the others (unknown task, args its handler refuses) are handed back.

        The handlers' arguments of those kept are validated here once
        (``delivery.kwargs``). Past the grace period a job is kept anyway, and
        the executor sends it to the dead letters.
        """
        unknown: list[Delivery] = []
        refused: list[Delivery] = []
        for delivery in deliveries:
            if delivery.task not in self._registry:
                unknown.append(delivery)
                continue
            found = self._arguments(delivery)
            if isinstance(found, Exception):
                refused.append(delivery)
            else:
                delivery.kwargs = found
        if not unknown and not refused:
            return deliveries
        skipped: set[int] = set()
        for group, error_class, reason in (
            (unknown, "UnknownTaskError", UNKNOWN_REASON),
            (refused, "InvalidArgsError", REFUSED_REASON),
        ):
            back, _past_grace = self.unknown.split(group)  # past the grace period: claimed, then dead
            if back:
                await self._send(back, error_class, reason)
                skipped.update(id(d) for d in back)
        return [d for d in deliveries if id(d) not in skipped]

    async def _send(self, back: list[Delivery], error_class: str, reason: str) -> None:
        handed, unmarked = await hand_back(
            self._pool,
            back,
            worker_id=self._worker_id,
            delay=self.unknown.delay,
            error_class=error_class,
            reason=reason,
        )
        for delivery in back:
            # Acknowledged: handed back (the relay publishes it again), or nothing to hand
            # back (finished...). Left pending, to be reclaimed and looked at again: a
            # publish not marked yet, or a reclaimed entry of a job running elsewhere.
            if delivery.job_id in handed or not (delivery.job_id in unmarked or delivery.reclaimed):
                self._on_skipped(delivery)
        if handed:
            log.warning(
                "jobs this worker cannot run handed back for a worker that can",
                extra={
                    "count": len(handed),
                    "task": ",".join(sorted({d.task for d in back})),
                    "worker_id": self._worker_id,
                    "error_class": error_class,
                },
            )
