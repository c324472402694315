"""How many more jobs this worker may take: prefetch never exceeds free concurrency.

One exception: jobs taken over from a dead or frozen worker may run beyond it
(:meth:`Capacity.take_over`, up to twice the concurrency), so a takeover never
waits behind a backlog; new reads then wait until the worker is back under its
concurrency.
"""

from __future__ import annotations

import asyncio


class Capacity:
    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.blocked = False  # no new reads at all (a job runs in isolation)
        self._freed = asyncio.Event()
        self._freed.set()

    @property
    def free(self) -> int:
        return min(0, self.size - self.used) if self.blocked else self.size - self.used

    def block(self) -> None:
        """Take no new reads until :meth:`unblock` (takeovers still may: :meth:`take_over`)."""
        self.blocked = True
        self._freed.clear()

    def unblock(self) -> None:
        self.blocked = False
        self._freed.set()

    def take(self, wanted: int) -> int:
        """Reserve up to ``wanted`` slots now; returns how many were reserved."""
        got = max(0, min(wanted, self.free))
        self.used += got
        if self.free <= 0:
            self._freed.clear()
        return got

    def take_over(self, wanted: int) -> int:
        """Reserve up to ``wanted`` slots, beyond the concurrency if need be (at most twice it)."""
        got = max(0, min(wanted, 2 * self.size - self.used))
        self.used += got
        if self.free <= 0:
            self._freed.clear()
        return got

    def add(self, count: int) -> None:
        """Count ``count`` slots as used without asking: a read sent while they were free, answered later.

        (:meth:`postbox.worker.consumer.Consumer.wait_then_read`: no capacity is held
        during its wait, and another reservation may have been made meanwhile.)
        """
        if count <= 0:
            return
        self.used += count
        if self.free <= 0:
            self._freed.clear()

    def release(self, count: int = 1) -> None:
        if count <= 0:
            return
        self.used -= count
        if self.used < 0:  # a bookkeeping bug must not wedge the worker
            self.used = 0
        self._freed.set()

    def wake(self) -> None:
        """Wake a waiter even without free capacity (the worker is stopping)."""
        self._freed.set()

    async def wait_free(self) -> None:
        """Return once a slot is free, or after :meth:`wake`."""
        if self.free <= 0:
            self._freed.clear()
            await self._freed.wait()
