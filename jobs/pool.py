"""A connection pool that hands out the connection returned last (a stack), so the backend it reaches is warm.

psycopg_pool keeps its idle connections in a queue: a checkout takes the one
that has waited longest, so a worker claiming one job every 5 ms sent each
claim to a different backend of its pool, idle for the pool's size times that.
On a small virtual machine a backend's first statement after a long rest costs
far more than one right after another (its caches, and its idle CPU's wake-up):
on the 2-vCPU machine of docs/benchmarks.md a claim's round trip in the worker
was 740-840 µs at 200 jobs/s, the floor's claim 560 µs on the one connection
it keeps (the two statements cost the same on equally rested backends).
Taking the connection returned last keeps the few connections that a light
load needs busy and warm, and leaves the rest idle, where the pool's
``max_idle`` closes those above ``min_size`` (PgBouncer hands out its server
connections the same way, for the same reason). The worker's claims now keep
a connection of their own (``postbox.worker.claims.Claimer``); its outcomes and
its handlers' transactions, and the API's requests, still come through here.

Only the choice among idle connections changes; waiting, growing, checks and
shrinking are psycopg_pool's own. The choice is made in a method psycopg_pool
keeps private, so it is used only where that method looks as this class
expects: otherwise the pool behaves exactly as psycopg_pool's (and
``tests/integration/test_pool.py`` fails, so an upgrade that changes it is noticed).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool


class StackPool(AsyncConnectionPool[AsyncConnection[Any]]):
    """:class:`psycopg_pool.AsyncConnectionPool`, handing out the idle connection returned last."""

    async def _get_ready_connection(self, timeout: float | None) -> AsyncConnection[Any] | None:  # noqa: ASYNC109
        # Called with the pool's lock held, as the method it replaces.
        idle = getattr(self, "_pool", None)
        if (
            (timeout is None or timeout > 0.0)  # (the pool's own method raises PoolTimeout then)
            and isinstance(idle, deque)
            and idle
            and isinstance(getattr(self, "_nconns_min", None), int)
        ):
            conn: AsyncConnection[Any] = idle.pop()
            self._nconns_min = min(self._nconns_min, len(idle))  # what the pool's shrinking looks at
            return conn
        return await super()._get_ready_connection(timeout)
