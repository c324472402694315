"""Limited jobs waiting in the worker for their rate reservation: one heap, one timer.

A limited claim (:mod:`postbox.worker.flow`) may answer that a job may start in
a moment (its reservation on a rate cell). A reservation near enough waits here,
its stream entry pending and its capacity not held, rather than going back
through the relay: :class:`FlowWaits` keeps those deliveries in a heap ordered
by due time, and one task claims again all those due by the time it runs
(up to ``WAIT_EARLY`` ahead, within the claim's own tolerance,
:data:`postbox.flow.EARLY`), in one limited claim: at 200 starts/s, one claim
per start would serialize on the key's lock. So they batch up by themselves
while a claim is in flight.

The heartbeat keeps a waiting entry's idle time fresh (:meth:`FlowWaits.deliveries`),
as for a running job's, so no other worker reclaims it while this one lives; a
dead worker's waiting entries are reclaimed after the visibility timeout. At
stop, nothing waiting is claimed: the entries stay pending for another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Coroutine
from typing import Any

from postbox.worker.capacity import Capacity
from postbox.worker.delivery import Delivery

WAIT_EARLY = 0.004  # seconds ahead of its due time a waiting delivery is claimed with the others due
WAIT_RETRY = 0.01  # no capacity for a due one yet: look again this much later
MAX_SHORT_WAIT = 30.0  # seconds: a rate reservation nearer than this waits in the worker
MAX_WAITING = 20_000  # deliveries waiting in one worker at most (beyond: held back through the relay)
MAX_BATCH = 1000  # most deliveries claimed again at once


class FlowWaits:
    """The deliveries waiting in this worker for their reservation, claimed again when due."""

    def __init__(
        self,
        *,
        capacity: Capacity,
        stopping: asyncio.Event,
        dispatch: Callable[[list[Delivery]], Coroutine[Any, Any, None]],
        lease: float,
    ) -> None:
        self._capacity = capacity
        self._stopping = stopping
        self._dispatch = dispatch  # claims and starts a batch (capacity for all of it is held); never raises
        self._lease = lease
        self._heap: list[tuple[float, int, Delivery]] = []  # (due, seq, delivery)
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._next_wake = float("inf")

    def __len__(self) -> int:
        return len(self._heap)

    def deliveries(self) -> list[Delivery]:
        """The deliveries waiting now (the heartbeat keeps their entries from going idle)."""
        return [d for _, _, d in self._heap]

    def short_wait(self) -> float:
        """A rate reservation at most this far away waits here, its entry pending (0: none may).

        Bounded in count: past MAX_WAITING, reservations go back through the relay.
        """
        if len(self._heap) >= MAX_WAITING:
            return 0.0
        return min(MAX_SHORT_WAIT, 2 * self._lease)

    def add(self, delivery: Delivery, delay: float) -> None:
        """Claim ``delivery`` again in ``delay`` seconds; its capacity is not held meanwhile."""
        due = time.monotonic() + delay
        heapq.heappush(self._heap, (due, next(self._seq), delivery))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="flow-waits")
        elif due < self._next_wake:
            self._wake.set()

    def stop(self) -> None:
        """Wake the timer so it ends (the worker's stopping event is set): nothing more is claimed."""
        self._wake.set()

    async def join(self) -> None:
        """Return once the timer task has ended."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while self._heap and not self._stopping.is_set():
            now = time.monotonic()
            first = self._heap[0][0]
            if first > now:
                self._next_wake = first
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), first - now)
                continue
            batch: list[Delivery] = []
            while self._heap and self._heap[0][0] <= now + WAIT_EARLY and len(batch) < MAX_BATCH:
                batch.append(heapq.heappop(self._heap)[2])
            taken = 0
            while not self._stopping.is_set():
                taken = self._capacity.take_over(len(batch))
                if taken:
                    break
                await self._capacity.wait_free()  # twice the concurrency in use: wait for a slot
            if self._stopping.is_set():
                self._capacity.release(taken)
                return  # left pending: another worker reclaims them
            for delivery in batch[taken:]:  # no capacity for these yet: next tick
                heapq.heappush(self._heap, (now + WAIT_RETRY, next(self._seq), delivery))
            await self._dispatch(batch[:taken])
        self._next_wake = float("inf")
