"""Fair queues: declare a queue fair by an argument of its jobs; read its keys' shares.

A fair queue serves the values of one argument of its jobs (the *key*: a
tenant, a customer) in turn instead of in enqueue order: the relay keeps at
most a window of the queue's jobs published and unfinished, and fills each
free place with a job of the key that has the fewest in flight
(:mod:`postbox.relay.fairness`; docs/job-control.md#fair-queues)::

    with psycopg.connect(url) as conn:
        postbox.fairness.declare(conn, "reports", by="tenant_id", window=200)

The declaration lives in PostgreSQL (``postbox.fair_queues``), so it holds for
every producer (Python, REST, SQL ``postbox.enqueue()``) and survives restarts;
the relay reads it every second. A job without the argument has the key ``''``
(all such jobs share one turn); a value that is not a string is keyed by its
JSON text (``42``, ``true``).

:func:`declare` changing the argument re-keys the queue's unfinished jobs;
:func:`clear` makes the queue plain again, its waiting jobs back in the relay's
id order. Both run in the caller's transaction (commit to apply).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from psycopg import AsyncConnection, Connection

from postbox import schema, sql
from postbox.errors import InvalidOptionError
from postbox.settings import QUEUE_NAME_RE

MAX_WINDOW = 1_000_000
MAX_ARG = 200
DECLARED_TTL = 2.0  # seconds a producer keeps the declarations it read (declared())

# Per database and schema: (read at, {queue: key argument}); read by producers, never at import.
_declared: dict[tuple[str, ...], tuple[float, dict[str, str]]] = {}


@dataclass(frozen=True)
class KeyShare:
    """One key of a fair queue: its jobs waiting to be published, and in flight (published, unfinished)."""

    key: str
    waiting: int
    in_flight: int


@dataclass(frozen=True)
class Fairness:
    """A queue's fairness: the argument, the window (None: ``POSTBOX_FAIR_WINDOW``), the busiest keys."""

    queue: str
    by: str
    window: int | None
    keys: list[KeyShare] = field(default_factory=list)
    unkeyed: int = 0  # jobs enqueued since the relay last looked (not keyed yet)
    waiting: int = 0  # every key's jobs waiting for the window
    in_flight: int = 0  # every key's jobs published and unfinished


def validate(queue: str, by: str, window: int | None) -> None:
    """Raise :class:`InvalidOptionError` naming the field unless the declaration is usable."""
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise InvalidOptionError(f"invalid queue name {queue!r}", field="queue")
    if not isinstance(by, str) or not 1 <= len(by) <= MAX_ARG:
        raise InvalidOptionError(f"by must name an argument (1-{MAX_ARG} characters)", field="by")
    whole = isinstance(window, int) and not isinstance(window, bool)
    if window is not None and (not whole or not 1 <= window <= MAX_WINDOW):
        raise InvalidOptionError(f"window must be a whole number 1..{MAX_WINDOW:,} (or None)", field="window")


def _params(queue: str, by: str, window: int | None, actor: str | None) -> dict[str, Any]:
    validate(queue, by, window)
    return {"queue": queue, "by": by, "window": window, "actor": actor}


def declare(conn: Connection[Any], queue: str, *, by: str, window: int | None = None, actor: str | None = None) -> None:
    """Make ``queue`` fair by the argument ``by`` (in the caller's transaction)."""
    params = _params(queue, by, window, actor)
    _declared.clear()  # this process's producers see the change at once
    statements = sql.active()
    row = conn.execute(statements.FAIR_QUEUE_UPSERT, params).fetchone()
    if row is not None and row[0] is not None and row[0] != by:
        conn.execute(statements.JOB_REKEY_FAIR, params)


async def declare_async(
    conn: AsyncConnection[Any], queue: str, *, by: str, window: int | None = None, actor: str | None = None
) -> None:
    """:func:`declare` on an async connection."""
    params = _params(queue, by, window, actor)
    _declared.clear()  # this process's producers see the change at once
    statements = sql.active()
    row = await (await conn.execute(statements.FAIR_QUEUE_UPSERT, params)).fetchone()
    if row is not None and row[0] is not None and row[0] != by:
        await conn.execute(statements.JOB_REKEY_FAIR, params)


def clear(conn: Connection[Any], queue: str) -> bool:
    """Make ``queue`` plain again; False if it was not fair."""
    _declared.clear()
    statements = sql.active()
    row = conn.execute(statements.FAIR_QUEUE_DELETE, {"queue": queue}).fetchone()
    conn.execute(statements.JOB_CLEAR_FAIR_KEYS, {"queue": queue})
    return row is not None


async def clear_async(conn: AsyncConnection[Any], queue: str) -> bool:
    """:func:`clear` on an async connection."""
    _declared.clear()
    statements = sql.active()
    row = await (await conn.execute(statements.FAIR_QUEUE_DELETE, {"queue": queue})).fetchone()
    await conn.execute(statements.JOB_CLEAR_FAIR_KEYS, {"queue": queue})
    return row is not None


async def status(conn: AsyncConnection[Any], queue: str, *, keys: int = 20) -> Fairness | None:
    """``queue``'s fairness and its ``keys`` keys with the most jobs waiting; None if it is not fair."""
    statements = sql.active()
    row = await (await conn.execute(statements.FAIR_QUEUE_GET, {"queue": queue})).fetchone()
    if row is None:
        return None
    shares = await (await conn.execute(statements.JOB_COUNT_FAIR_KEYS, {"queue": queue, "limit": keys})).fetchall()
    unkeyed = await (await conn.execute(statements.JOB_COUNT_FAIR_UNKEYED, {"queue": queue})).fetchone()
    totals = await (await conn.execute(statements.JOB_COUNT_FAIR_TOTALS, {"queue": queue})).fetchone()
    return Fairness(
        queue=row[0],
        by=row[1],
        window=row[2],
        keys=[KeyShare(str(r[0]), int(r[1]), int(r[2])) for r in shares],
        unkeyed=int(unkeyed[0]) if unkeyed else 0,
        waiting=int(totals[0]) if totals else 0,
        in_flight=int(totals[1]) if totals else 0,
    )


def key_of(args: str, by: str) -> str | None:
    """The key the relay would give a job with these ``args`` (JSON text); None when only the relay can tell.

    ``''`` without the argument, the value of a string, the digits of an integer;
    anything else (a float, a bool, an object) is left to the relay
    (``args ->> by`` in PostgreSQL), so both always agree.
    """
    value = orjson.loads(args).get(by)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _where(conn: Connection[Any] | AsyncConnection[Any]) -> tuple[str, ...]:
    """The database (server, port, name) and schema a cached copy belongs to."""
    info = conn.info
    return (str(info.host), str(info.port), str(info.dbname), schema.active())


def _cached(where: tuple[str, ...], clock: Callable[[], float]) -> dict[str, str] | None:
    entry = _declared.get(where)
    if entry is not None and clock() - entry[0] < DECLARED_TTL:
        return entry[1]
    return None


def declared(conn: Connection[Any], *, clock: Callable[[], float] = time.monotonic) -> dict[str, str]:
    """The fair queues and their key arguments, read on ``conn`` at most every ``DECLARED_TTL`` seconds.

    Producers use it to write a bulk enqueue's keys with its rows (the relay keys
    a row that has none: a declaration newer than this copy costs nothing but that).
    """
    where = _where(conn)
    found = _cached(where, clock)
    if found is None:
        found = {row[0]: row[1] for row in conn.execute(sql.active().FAIR_QUEUE_LIST).fetchall()}
        _declared[where] = (clock(), found)
    return found


async def declared_async(conn: AsyncConnection[Any], *, clock: Callable[[], float] = time.monotonic) -> dict[str, str]:
    """:func:`declared` on an async connection."""
    where = _where(conn)
    found = _cached(where, clock)
    if found is None:
        rows = await (await conn.execute(sql.active().FAIR_QUEUE_LIST)).fetchall()
        found = {row[0]: row[1] for row in rows}
        _declared[where] = (clock(), found)
    return found
