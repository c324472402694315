"""Fair queues: the relay fills each fair queue's window with its keys' jobs in turn.

A queue declared fair (``postbox.fairness.declare``; table ``fair_queues``)
names an argument of its jobs, ``tenant_id`` say; a job's value of it is its
*key*. The relay publishes everything else in id order (:mod:`postbox.relay.publisher`),
but not a fair queue's jobs: when its id-ordered scan meets one, it writes the
job's key on its row (``outbox.fair_key``), which moves the row from the relay's
list to the fair queue's own index (:meth:`FairQueues.divert`). Then, for each
fair queue, it keeps at most a *window* of jobs published and unfinished
(``queued`` or ``running``) and fills the room left with the waiting jobs of
the keys with the fewest in flight first, each key's jobs in priority then id
order (:meth:`FairQueues.step`; the statement ``JOB_GET_FAIR_DUE``).

So a key with a backlog of 100,000 jobs has at most a window of them in its
stream; a key that starts waiting later gets the next free places of the window
(it has none in flight), and its jobs start after at most about a window of the
queue's jobs, not after the backlog.

Everything is counted from PostgreSQL at each fill: a Redis flush or a worker
killed mid-job loses no accounting (a stale run still counts until its job is
published again and ends), and a relay that takes over the lead starts from the
rows. While jobs wait in a full window the relay looks again every
``fair_poll_interval`` (a finished job does not wake the relay).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from postbox import pgarray, sql
from postbox.relay.publisher import BatchResult, Publisher, Row

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 1.0  # seconds between reads of the declarations (fair_queues)
NEWEST_SCAN = 1000  # unkeyed waiting rows, newest first, looked at by each step (JOB_SET_FAIR_KEY_NEWEST)
SAFETY_INTERVAL = 30.0  # seconds between sweeps for keyed jobs of queues that are fair no more


@dataclass(frozen=True)
class FairQueue:
    """One declaration: the queue, the argument that keys its jobs, its window (None: the setting)."""

    queue: str
    by: str
    window: int | None = None


@dataclass
class FillResult:
    """What one fill of one queue did."""

    queue: str
    in_flight: int
    room: int
    batch: BatchResult = field(default_factory=BatchResult)


class FairQueues:
    """The leader's fair-queue duty: key the fair queues' rows, fill their windows."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        default_window: int,
        poll_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        on_fill: Callable[[FillResult], None] | None = None,
    ) -> None:
        self.publisher = publisher
        self.default_window = default_window
        self.poll_interval = poll_interval
        self.monotonic = monotonic
        self.on_fill = on_fill
        self.queues: dict[str, FairQueue] = {}
        self._refreshed = -1e9
        self._swept = -1e9
        self._waiting: set[str] = set()  # queues whose last fill was full: more may wait
        self._newest_scanned = -1e9
        self._hurry = False  # the last step found a window at least half empty: refill sooner

    def window(self, queue: FairQueue) -> int:
        return queue.window or self.default_window

    async def refresh(self, conn: AsyncConnection[Any], *, force: bool = False) -> None:
        """Read the declarations (every ``REFRESH_INTERVAL``); the publisher diverts only while some exist."""
        now = self.monotonic()
        if not force and now - self._refreshed < REFRESH_INTERVAL:
            return
        self._refreshed = now
        rows = await (await conn.execute(sql.active().FAIR_QUEUE_LIST)).fetchall()
        self.queues = {row[0]: FairQueue(row[0], row[1], row[2]) for row in rows}
        self._waiting &= set(self.queues)
        self.publisher.divert = self.divert if self.queues else None
        if now - self._swept >= SAFETY_INTERVAL:
            # Keyed jobs of a queue that is fair no more (its declaration was removed
            # another way than postbox.fairness.clear, or the job moved queue): back
            # to the id-ordered list, so that nothing waits for a window nobody fills.
            self._swept = now
            cur = await conn.execute(sql.active().JOB_CLEAR_FAIR_KEYS, {"queue": None})
            if cur.rowcount:
                log.warning("fair keys cleared from jobs of queues that are not fair", extra={"count": cur.rowcount})

    async def divert(self, conn: AsyncConnection[Any], rows: list[Row]) -> list[int]:
        """Key the rows of fair queues among a selected batch; return their ids (not to be published now)."""
        ids = [row[0] for row in rows if row[1] in self.queues]
        if not ids:
            return []
        cur = await conn.execute(sql.active().JOB_SET_FAIR_KEY, {"ids": pgarray.ints(ids)})
        keyed = [row[0] for row in await cur.fetchall()]
        if keyed:
            self._waiting.update(row[1] for row in rows if row[1] in self.queues)
        return keyed

    async def step(self, conn: AsyncConnection[Any], *, notified: bool = True) -> list[FillResult]:
        """Key the newest waiting rows of fair queues, then fill every fair queue's window once.

        ``notified``: the relay was woken by an insert's NOTIFY (new rows may wait to be
        keyed); otherwise the newest rows are looked at once a second only (a lost NOTIFY).
        """
        await self.refresh(conn)
        results: list[FillResult] = []
        if not self.queues:
            return results
        now = self.monotonic()
        if notified or now - self._newest_scanned >= REFRESH_INTERVAL:
            self._newest_scanned = now
            await self._key_newest(conn)
        for queue in self.queues.values():
            results.append(await self.fill(conn, queue))
        # A window that drained by half or more since the last fill (its workers are fast
        # for it): look again in a quarter of the interval, before they run dry. Otherwise
        # few, large fills: each walks the index entries of the jobs published since the
        # last vacuum, so small frequent ones cost more per job.
        self._hurry = any(r.room * 2 >= self.window(self.queues[r.queue]) for r in results if r.queue in self.queues)
        return results

    async def _key_newest(self, conn: AsyncConnection[Any]) -> None:
        # The id-ordered scan keys a backlog from its oldest rows (divert); a key that
        # starts waiting behind a backlog enqueued just before would wait for all of it
        # to be keyed. So each step also keys the newest rows: such a key is served in
        # its turn at once. (While a backlog is still being keyed, a key's newest jobs
        # can go before its middle ones: order within a key is by priority then id
        # among the jobs keyed so far.)
        cur = await conn.execute(sql.active().JOB_SET_FAIR_KEY_NEWEST, {"scan": NEWEST_SCAN})
        self._waiting.update(row[0] for row in await cur.fetchall())

    async def fill(self, conn: AsyncConnection[Any], queue: FairQueue) -> FillResult:
        """Publish up to the room left in ``queue``'s window, keys in turn (one statement, then the publish)."""
        params = {"queue": queue.queue, "window": self.window(queue)}
        rows = await (await conn.execute(sql.active().JOB_GET_FAIR_DUE, params)).fetchall()
        free, in_flight = int(rows[0][9]), int(rows[0][10])
        due = [row for row in rows if row[0] is not None]
        result = FillResult(queue.queue, in_flight, free)
        if free > 0:
            if len(due) < free:
                self._waiting.discard(queue.queue)  # every due job fitted: none waits
            else:
                self._waiting.add(queue.queue)
        if due:
            result.batch = await self.publisher.publish_rows(conn, due)
        if self.on_fill is not None:
            self.on_fill(result)
        return result

    def busy(self) -> bool:
        """Whether a fair queue may have jobs waiting for its window (the relay then fills between batches)."""
        return bool(self._waiting)

    def wait_hint(self) -> float | None:
        """Seconds until the next fill is worth it: ``poll_interval`` while a window may hold back jobs."""
        if not self._waiting:
            return None
        return self.poll_interval / 4 if self._hurry else self.poll_interval
