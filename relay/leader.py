"""Leader election: a PostgreSQL advisory lock held by one dedicated session.

The session that holds the lock is the session every publishing statement runs
on. If PostgreSQL ends it (``pg_terminate_backend``, a restart, a network cut,
or ``idle_session_timeout`` while the process is frozen), the lock is gone *and*
the next statement of the old leader fails, so it can no longer select or mark
anything: a lost session stops publishing at once.

``idle_session_timeout`` is what turns a frozen leader (SIGSTOP, a stalled
event loop) into a failover: a live leader touches its session at least every
``heartbeat_interval``; a frozen one goes silent, the server ends its session
after ``relay_session_timeout`` seconds and a standby gets the lock.

Connect directly to PostgreSQL, never through a transaction pooler: a pooler
would move the lock and the statements onto different server sessions.

A live leader can also stall without going silent: a statement of the lock
session waiting for a row lock that some other session holds keeps the session
busy, so ``idle_session_timeout`` never ends it and no standby can take over.
So the session's lock waits are bounded too (``lock_timeout``: twice the
visibility timeout, as a worker's are, since every holder postbox knows of is
cut off sooner): a leader stuck behind a lock for longer gives up its session
and its lock, and starts over. The heartbeat's bookkeeping of other relays'
and workers' rows, and a new leader's deposing of the old one's row, skip rows
that someone holds instead of waiting for them.

Do not use psycopg's pipeline mode on this session: after a pipeline psycopg
sends a Flush behind the Sync, which disarms PostgreSQL's idle-session timer
(tested: the session then never times out), and a frozen leader would keep
the lock forever.
"""

from __future__ import annotations

import os
import select
import socket
from typing import Any

from psycopg import AsyncConnection, pq

from postbox import sql
from postbox.db import connect_async, worker_bounds

APPLICATION_NAME = "postbox-relay"


class LeadershipLost(RuntimeError):
    """A mark found a newer leader's term recorded: this relay must stop publishing and stand by."""


class LeaderSession:
    """One relay's lock session: try the lock, keep the registry row, release."""

    def __init__(
        self,
        conn: AsyncConnection[Any],
        *,
        relay_id: str,
        lock_key: int,
        relay_stale: float = 5.0,
        worker_stale: float = 30.0,
    ) -> None:
        self.conn = conn
        self.relay_id = relay_id
        self.lock_key = lock_key
        self.relay_stale = relay_stale  # a relay silent this long is recorded stopped
        self.worker_stale = worker_stale  # a worker silent this long (its lease) is recorded stopped
        self.holds_lock = False
        self.term = 0

    @classmethod
    async def open(
        cls, url: str, *, relay_id: str, lock_key: int, session_timeout: float, worker_lease: float = 30.0
    ) -> LeaderSession:
        conn = await connect_async(
            url,
            autocommit=True,
            application_name=APPLICATION_NAME,
            connect_timeout=5,
            # synchronous_commit=off: a mark lost in a PostgreSQL crash only means the row is
            # published again (a duplicate the workers absorb), so the relay does not wait for
            # the WAL flush of every batch.
            options=(
                f"-c idle_session_timeout={int(session_timeout * 1000)} -c synchronous_commit=off"
                f" -c lock_timeout={int(worker_bounds(worker_lease).lock * 1000)}"
            ),
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=2,
        )
        # A relay silent for longer than its lock session can live is not leading, nor
        # standing by; a worker silent for longer than its lease has lost its jobs.
        return cls(conn, relay_id=relay_id, lock_key=lock_key, relay_stale=session_timeout, worker_stale=worker_lease)

    @property
    def backend_pid(self) -> int:
        return self.conn.info.backend_pid

    def looks_alive(self) -> bool:
        """Whether the lock session still stands, as far as its socket tells without a round trip.

        The session is idle between the loop's statements and asked for nothing, so the
        server has nothing to say on it: anything waiting to be read (a terminated
        backend's last message, its closed socket) means it may be gone. A network that
        went silent does not show here. A relay about to send jobs that came with their
        notifications asks this first (relay/service.py): the listener's own connection
        can outlive the lock session, and a deposed leader must not send what its
        successor sends too. A false alarm (a notice the server sent unasked) costs one
        select, which reads it.
        """
        if self.conn.closed or self.conn.pgconn.status != pq.ConnStatus.OK:
            return False
        poller = select.poll()
        poller.register(self.conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)

    async def register(self, role: str) -> None:
        await self.conn.execute(
            sql.active().RELAY_UPSERT,
            {"id": self.relay_id, "host": socket.gethostname(), "pid": os.getpid(), "role": role},
        )

    async def set_role(self, role: str) -> None:
        await self.conn.execute(sql.active().RELAY_SET_ROLE, {"id": self.relay_id, "role": role})

    async def heartbeat(self) -> None:
        """Record this relay's role and time; record silent relays and workers stopped."""
        await self.conn.execute(
            sql.active().RELAY_HEARTBEAT,
            {
                "id": self.relay_id,
                "role": "leader" if self.holds_lock else "standby",
                "relay_stale": self.relay_stale,
                "worker_stale": self.worker_stale,
            },
        )

    async def try_acquire(self) -> bool:
        """Take the lock if it is free; on success record the new term and return True."""
        cur = await self.conn.execute(sql.active().LEADER_TRY_LOCK, {"key": self.lock_key})
        row = await cur.fetchone()
        if not (row and row[0]):
            return False
        self.holds_lock = True
        cur = await self.conn.execute(sql.active().LEADER_ELECT, {"id": self.relay_id})
        term_row = await cur.fetchone()
        self.term = int(term_row[0]) if term_row else 0
        return True

    async def release(self) -> None:
        """Unlock and record ``stopped``; the session stays open (close it after)."""
        if self.holds_lock:
            await self.conn.execute(sql.active().LEADER_UNLOCK, {"key": self.lock_key})
            self.holds_lock = False
        await self.set_role("stopped")

    async def close(self) -> None:
        await self.conn.close()
