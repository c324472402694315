"""The relay's raw RESP batches against a real Redis: replies in order, one deadline per batch."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from postbox import resp
from tests.harness.redis_server import RedisServer


async def test_a_batch_reads_every_reply_in_order_and_keeps_the_connection_timeout(
    redis_url: str, redis_prefix: str
) -> None:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=5)
    key = f"{redis_prefix}:resp".encode()
    try:
        payload = b"".join(resp.xadd(key, [(b"n", b"%d" % i)]) for i in range(500))
        payload += resp.command(b"INCR", key)  # WRONGTYPE: an error reply, in its place
        payload += resp.command(b"XLEN", key)
        replies = await resp.send_batch(client, payload, 502)
        assert len(replies) == 502
        assert all(isinstance(r, bytes) and r.count(b"-") == 1 for r in replies[:500])
        assert isinstance(replies[500], ResponseError) and "WRONGTYPE" in str(replies[500])
        assert replies[501] == 500
        connection = await client.connection_pool.get_connection()
        assert connection.socket_timeout == 5  # put back after the batch
        await client.connection_pool.release(connection)
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_batch_to_a_frozen_redis_fails_after_the_socket_timeout(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.5)
    assert private_redis.proc is not None
    pid = private_redis.proc.pid
    try:
        assert await client.ping()
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            await resp.send_batch(client, resp.xadd(b"k", [(b"n", b"1")]) * 100, 100)
        assert 0.4 < time.monotonic() - started < 3.0
    finally:
        os.kill(pid, signal.SIGCONT)
    # the half-read connection was dropped: the next command gets a clean one
    assert await client.ping()
    assert await client.xlen("k") == 100
    await client.aclose()


async def test_a_blocking_exchange_extends_its_own_deadline_only(private_redis: RedisServer) -> None:
    """``blocks`` lengthens one exchange's deadline; the connection's timeout is as it was after it.

    (It once kept the lengthened value: every blocking wait added its block to the
    connection's timeout, and a frozen server held a long-lived waiter that much longer.)
    """
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=0.5)
    assert private_redis.proc is not None
    pid = private_redis.proc.pid
    conn = await resp.take_connection(client)
    try:
        wait = resp.command(b"XREAD", b"BLOCK", b"700", b"STREAMS", b"nothing", b"$")
        for _ in range(3):  # each blocks 0.7 s, past the 0.5 s timeout: the deadline is 1.2 s
            assert await resp.exchange(conn, wait, 1, blocks=1.0) == [None]
            assert conn.socket_timeout == 0.5
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            await resp.exchange(conn, wait, 1, blocks=1.0)
        assert 1.4 < time.monotonic() - started < 4.0  # 0.5 + 1.0, not 0.5 + 4 x 1.0
    finally:
        os.kill(pid, signal.SIGCONT)
        await client.connection_pool.release(conn)
        await client.aclose()
