"""Outbox ids drawn ahead, a block per connection, for enqueues that wait for no reply.

In psycopg's pipeline mode, :func:`postbox.enqueue` sends its INSERT with an id
it already holds and returns at once: the statement travels with the caller's
next statement or COMMIT, so the enqueue adds no round trip. Drawing a block
costs one round trip per ``BLOCK`` enqueues on that connection.

An id is unique whether or not its transaction commits (sequence values are
never handed out twice), so a block survives rollbacks. Ids of one block can be
lower than ids other connections drew later; nothing orders by id across
producers (the relay publishes every committed row, whatever its id).
"""

from __future__ import annotations

from collections import deque
from typing import Any
from weakref import WeakKeyDictionary

from psycopg import AsyncConnection, Connection

from postbox import sql

BLOCK = 32

_blocks: WeakKeyDictionary[Connection[Any] | AsyncConnection[Any], deque[int]] = WeakKeyDictionary()


def take(conn: Connection[Any]) -> int:
    """The next reserved outbox id of ``conn`` (drawing a new block when it has none)."""
    ids = _blocks.get(conn)
    if not ids:
        rows = conn.execute(sql.active().JOB_NEXT_IDS, {"n": BLOCK}).fetchall()
        ids = _blocks[conn] = deque(sorted(row[0] for row in rows))
    return ids.popleft()


async def take_async(conn: AsyncConnection[Any]) -> int:
    """The async twin of :func:`take`."""
    ids = _blocks.get(conn)
    if not ids:
        cur = await conn.execute(sql.active().JOB_NEXT_IDS, {"n": BLOCK})
        ids = _blocks[conn] = deque(sorted(row[0] for row in await cur.fetchall()))
    return ids.popleft()
