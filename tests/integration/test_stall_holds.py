"""What one stalled process can hold: reads that wait on Redis hold no transaction meanwhile.

A Redis that accepts the connection and never answers (a frozen server, a
half-open connection) stands in for the stall; the PostgreSQL session of the
API's queue statistics is then looked up in ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from redis.asyncio import Redis

from postbox.app.services import queues as queue_service
from tests.harness.api import insert_job


async def test_queue_stats_hold_no_transaction_while_redis_stalls(
    database_url: str, aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    insert_job(conn)  # a queue to count (apiq)
    conn.commit()
    reached = asyncio.Event()
    peers: list[asyncio.StreamWriter] = []

    async def frozen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer)
        await reader.read(1)
        reached.set()  # a command arrived; no reply will

    server = await asyncio.start_server(frozen, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    redis = Redis(host="127.0.0.1", port=port, socket_timeout=60)
    pid = aconn.info.backend_pid
    stats = asyncio.create_task(queue_service.queue_stats(aconn, redis, "stall"))
    try:
        await asyncio.wait_for(reached.wait(), 10)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as watcher:

            async def state() -> str:
                cur = await watcher.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid])
                row = await cur.fetchone()
                assert row is not None
                return str(row[0])

            assert await state() == "idle"  # was "idle in transaction" for the whole Redis wait
            assert not stats.done()
    finally:
        stats.cancel()
        for writer in peers:
            writer.close()
        server.close()
        await server.wait_closed()
        await redis.aclose()
