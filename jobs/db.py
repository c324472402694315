"""Connections: small helpers so every process opens PostgreSQL the same way, with its session bounds.

Every session postbox opens bounds what a stuck peer can make it hold or wait
for (:class:`SessionBounds`, per process; docs/operations.md#session-bounds):
a process frozen inside a transaction (SIGSTOP, a GC pause, a frozen VM, a
half-open connection) is cut off after ``idle_in_transaction``, so the locks it
held are freed; a statement waits at most ``lock`` for a lock and runs at most
``statement``. The bounds are set with ``set_config`` on each new session (not
as startup options: a transaction-pooling PgBouncer refuses those), and the
flow-control claim sets tighter ones for its own transaction
(``postbox.worker.flow``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, Connection

from postbox import socket_wait, sql


def connect(url: str, *, autocommit: bool = False, application_name: str = "postbox", **kwargs: Any) -> Connection[Any]:
    return Connection.connect(url, autocommit=autocommit, application_name=application_name, **kwargs)


async def connect_async(
    url: str, *, autocommit: bool = False, application_name: str = "postbox", **kwargs: Any
) -> AsyncConnection[Any]:
    """A :class:`postbox.socket_wait.Connection`: its socket stays registered with the loop between round trips."""
    return await socket_wait.Connection.connect(url, autocommit=autocommit, application_name=application_name, **kwargs)


def _ms(seconds: float) -> str:
    return str(max(0, round(seconds * 1000)))


@dataclass(frozen=True, slots=True)
class SessionBounds:
    """Seconds a session may sit idle inside a transaction, wait for a lock, run one statement (0: unbounded)."""

    idle_in_transaction: float = 0.0
    lock: float = 0.0
    statement: float = 0.0

    def params(self, *, local: bool) -> dict[str, Any]:
        return {
            "idle_ms": _ms(self.idle_in_transaction),
            "lock_ms": _ms(self.lock),
            "statement_ms": _ms(self.statement),
            "local": local,
        }

    async def apply(self, conn: AsyncConnection[Any], *, local: bool = False) -> None:
        """Set the bounds on ``conn``: for the session, or (``local``) for its open transaction only."""
        await conn.execute(sql.active().SESSION_SET_BOUNDS, self.params(local=local))
        if not local and not conn.autocommit:
            await conn.commit()  # a session setting made in a transaction lasts only if it commits

    async def configure(self, conn: AsyncConnection[Any]) -> None:
        """An ``AsyncConnectionPool(configure=...)`` callback."""
        await self.apply(conn)


def worker_bounds(visibility_timeout: float) -> SessionBounds:
    """A worker's sessions (its claims, outcomes, heartbeats and handlers' ``ctx.transaction()``).

    Idle in a transaction: the visibility timeout. A worker frozen inside a
    transaction (its handler's, holding the job's fence row) is cut off when its
    lease would have expired anyway, so the takeover's fence does not wait on it.
    Lock waits: twice that (every holder postbox knows of is cut off sooner), so a
    wait past it means something outside postbox holds the lock. No statement
    bound on the session: handlers run their own queries on it.
    """
    v = max(1.0, visibility_timeout)
    return SessionBounds(idle_in_transaction=v, lock=2 * v, statement=0.0)


def claim_bounds(visibility_timeout: float) -> SessionBounds:
    """The flow-control claim's own transaction: it holds its keys' locks, which every worker's claims need.

    It never waits on anything but PostgreSQL, so a second idle inside it is a
    stalled process: cut off after a quarter of the visibility timeout (1-5 s),
    its keys' locks freed. Its lock waits and statements are bounded by half the
    visibility timeout (at least 2 s): a claim that cannot decide by then fails,
    its deliveries stay pending and are read again.
    """
    v = max(1.0, visibility_timeout)
    return SessionBounds(idle_in_transaction=min(5.0, max(1.0, v / 4)), lock=max(2.0, v / 2), statement=max(2.0, v / 2))


# Operators' processes: a request or a command never holds a transaction across I/O
# other than PostgreSQL's, and an answer after the bound is no use to its caller.
API_BOUNDS = SessionBounds(idle_in_transaction=10.0, lock=5.0, statement=30.0)
ADMIN_BOUNDS = SessionBounds(idle_in_transaction=60.0, lock=10.0, statement=300.0)
