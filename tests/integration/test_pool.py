"""postbox.pool.StackPool: the idle connection returned last is handed out first; the rest is psycopg_pool's.

Real PostgreSQL sessions, told apart by their backend pids. If a psycopg_pool
upgrade changes the private method StackPool replaces, the pool falls back to
psycopg_pool's own order and the first test here fails.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from postbox.pool import StackPool


async def _pid(conn: AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT pg_backend_pid()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _checked_out_in_turn(pool: AsyncConnectionPool[Any], times: int) -> list[int]:
    """The backend pid of each of ``times`` checkouts made one after another (each returned before the next)."""
    pids = []
    for _ in range(times):
        async with pool.connection() as conn:
            pids.append(await _pid(conn))
    return pids


async def _three_returned_in_order(pool: AsyncConnectionPool[Any]) -> list[int]:
    """Three connections checked out at once, then returned first to last; their pids in that order."""
    conns = [await pool.getconn() for _ in range(3)]
    pids = [await _pid(conn) for conn in conns]
    for conn in conns:
        await pool.putconn(conn)
    return pids


async def test_the_connection_returned_last_is_handed_out_next(database_url: str) -> None:
    async with StackPool(database_url, min_size=3, max_size=3, open=False) as pool:
        await pool.wait(timeout=30)
        first, second, third = await _three_returned_in_order(pool)
        assert len({first, second, third}) == 3
        # One checkout at a time: always the top of the stack, the one returned last.
        assert await _checked_out_in_turn(pool, 5) == [third] * 5
        # Two at once: the top two, newest first; then the order they came back in decides.
        a, b = await pool.getconn(), await pool.getconn()
        assert [await _pid(a), await _pid(b)] == [third, second]
        await pool.putconn(b)
        await pool.putconn(a)
        assert await _checked_out_in_turn(pool, 1) == [third]


async def test_psycopg_pool_itself_rotates_through_its_connections(database_url: str) -> None:
    """What StackPool changes: psycopg_pool's own pool hands out the connection idle longest."""
    async with AsyncConnectionPool(database_url, min_size=3, max_size=3, open=False) as pool:
        await pool.wait(timeout=30)
        first, second, third = await _three_returned_in_order(pool)
        assert await _checked_out_in_turn(pool, 3) == [first, second, third]


async def test_a_checkout_with_none_idle_waits_for_a_return_and_times_out_as_psycopg_pool_does(
    database_url: str,
) -> None:
    async with StackPool(database_url, min_size=1, max_size=1, timeout=0.5, open=False) as pool:
        await pool.wait(timeout=30)
        held = await pool.getconn()
        with pytest.raises(PoolTimeout):
            await pool.getconn(timeout=0.2)
        waiting = asyncio.ensure_future(pool.getconn(timeout=10))
        await asyncio.sleep(0)
        assert not waiting.done()
        pid = await _pid(held)
        await pool.putconn(held)
        got = await asyncio.wait_for(waiting, 10)
        assert await _pid(got) == pid
        await pool.putconn(got)
        assert pool.get_stats()["requests_errors"] == 1


async def test_the_connections_left_idle_are_the_ones_the_pool_shrinks(database_url: str) -> None:
    """Above min_size, a connection unused for max_idle is closed: with a stack, the bottom ones."""
    async with StackPool(database_url, min_size=1, max_size=3, max_idle=0.5, open=False) as pool:
        await pool.wait(timeout=30)
        conns = [await pool.getconn() for _ in range(3)]
        pids = [await _pid(conn) for conn in conns]
        for conn in conns:
            await pool.putconn(conn)
        deadline = asyncio.get_running_loop().time() + 30
        while pool.get_stats()["pool_size"] > 1:
            assert asyncio.get_running_loop().time() < deadline, "the pool did not shrink to min_size"
            async with pool.connection() as conn:  # a light load: one checkout at a time
                assert await _pid(conn) == pids[-1]
            await asyncio.sleep(0.1)
        assert await _checked_out_in_turn(pool, 1) == [pids[-1]]
