"""Fair queues as operators see and change them: the logic behind the API and the CLI.

A queue's fairness (:mod:`postbox.fairness`): the argument that keys its jobs,
its window, and per key the jobs waiting for the window and in flight (the keys
with the most waiting first). Declaring and clearing run in one transaction
with their audit row; bad input raises :class:`~postbox.errors.InvalidOptionError`
naming the field, and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from postbox import fairness, sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import check_queue_name
from postbox.app.services.errors import NotFoundError
from postbox.app.services.queues import end_read


@dataclass(frozen=True)
class KeyShare:
    key: str
    waiting: int
    in_flight: int


@dataclass(frozen=True)
class QueueFairness:
    """A fair queue: ``window`` None means ``POSTBOX_FAIR_WINDOW`` (``window_in_force`` says which)."""

    queue: str
    by: str
    window: int | None
    window_in_force: int
    in_flight: int
    waiting: int
    unkeyed: int
    keys: list[KeyShare] = field(default_factory=list)


async def get(conn: AsyncConnection[Any], queue: str, *, default_window: int, keys: int = 20) -> QueueFairness:
    """``queue``'s fairness and its ``keys`` busiest keys; NotFoundError if the queue is not fair."""
    check_queue_name(queue)
    found = await fairness.status(conn, queue, keys=keys)
    await end_read(conn)
    if found is None:
        raise NotFoundError(f"queue {queue!r} is not fair", details={"queue": queue})
    shares = [KeyShare(k.key, k.waiting, k.in_flight) for k in found.keys]
    return QueueFairness(
        queue=found.queue,
        by=found.by,
        window=found.window,
        window_in_force=found.window or default_window,
        in_flight=found.in_flight,
        waiting=found.waiting,
        unkeyed=found.unkeyed,
        keys=shares,
    )


async def declare(
    conn: AsyncConnection[Any], queue: str, by: str, window: int | None, actor: Actor, *, default_window: int
) -> QueueFairness:
    """Make ``queue`` fair by ``by`` (re-keying its jobs if the argument changed); audited."""
    fairness.validate(queue, by, window)
    async with conn.transaction():
        await fairness.declare_async(conn, queue, by=by, window=window, actor=actor.name)
        await record_audit(conn, actor, "queue.fair", f"queue:{queue}", {"by": by, "window": window})
    return await get(conn, queue, default_window=default_window)


async def clear(conn: AsyncConnection[Any], queue: str, actor: Actor) -> bool:
    """Make ``queue`` plain again (its waiting jobs back in id order); audited. False if it was not fair."""
    check_queue_name(queue)
    async with conn.transaction():
        was = await fairness.clear_async(conn, queue)
        if was:
            await record_audit(conn, actor, "queue.unfair", f"queue:{queue}")
    return was


async def by_queue(conn: AsyncConnection[Any], *, default_window: int, keys: int = 5) -> dict[str, QueueFairness]:
    """Every fair queue's fairness (its ``keys`` keys with the most waiting): what the queue lists show."""
    rows = await (await conn.execute(sql.active().FAIR_QUEUE_LIST)).fetchall()
    found = {}
    for row in rows:
        found[str(row[0])] = await get(conn, str(row[0]), default_window=default_window, keys=keys)
    return found
