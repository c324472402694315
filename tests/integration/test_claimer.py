"""postbox.worker.claims.Claimer: claims on a connection kept from the pool; the pool's own for a second claim at once.

Real servers: jobs enqueued, published and read as a worker reads them; the
pool's request count tells a checkout apart from a claim on the kept connection.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

from postbox.settings import Settings
from postbox.streams import stream_key
from postbox.worker.claims import Claimer
from postbox.worker.consumer import Consumer, ensure_groups
from postbox.worker.delivery import Delivery
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch

APP = "postbox-claimer-test"
WORKER = "worker-cccccccc"


async def _read_one_by_one(
    aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, prefix: str, count: int
) -> list[list[Delivery]]:
    """``count`` w_noop jobs enqueued, published and read: one delivery per read."""
    for _ in range(count):
        await enqueue(aconn, t.w_noop)
    stream = stream_key(prefix, t.QUEUE, 5)
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, prefix)
    reader = Consumer(redis, consumer=WORKER)
    reads = [(await reader.read([stream], 1))[0] for _ in range(count)]
    assert [len(read) for read in reads] == [1] * count
    return reads


def _checkouts(pool: AsyncConnectionPool[Any]) -> int:
    return pool.get_stats().get("requests_num", 0)


async def _states(aconn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    return await fetch(aconn, "SELECT state, count(*) FROM postbox.outbox GROUP BY state ORDER BY state")


async def test_claims_one_after_another_take_one_connection_from_the_pool_once(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    reads = await _read_one_by_one(effects, redis, wsettings.redis_prefix, 3)
    async with AsyncConnectionPool(database_url, min_size=1, kwargs={"autocommit": True}) as pool:
        claimer = Claimer(pool, worker_id=WORKER, lease=30)
        for read in reads:
            assert len((await claimer.claim(read)).run) == 1
        assert _checkouts(pool) == 1
        await claimer.close()
        assert pool.get_stats()["pool_available"] >= 1  # the kept connection is back
    assert await _states(effects) == [("running", 3)]


async def test_a_claim_while_another_is_under_way_goes_through_the_pool(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    first, second = await _read_one_by_one(effects, redis, wsettings.redis_prefix, 2)
    async with AsyncConnectionPool(database_url, min_size=2, kwargs={"autocommit": True}) as pool:
        claimer = Claimer(pool, worker_id=WORKER, lease=30)
        async with await psycopg.AsyncConnection.connect(database_url) as blocker:
            # The first job's row locked elsewhere: its claim waits on the kept connection.
            await blocker.execute("SELECT 1 FROM postbox.outbox WHERE id = %s FOR UPDATE", (first[0].job_id,))
            waiting = asyncio.ensure_future(claimer.claim(first))
            deadline = asyncio.get_running_loop().time() + 15
            while _checkouts(pool) < 1:  # until the first claim has its connection
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            assert len((await asyncio.wait_for(claimer.claim(second), 15)).run) == 1
            assert not waiting.done()
            assert _checkouts(pool) == 2
            await blocker.rollback()
        assert len((await asyncio.wait_for(waiting, 15)).run) == 1
        await claimer.close()
    assert await _states(effects) == [("running", 2)]


async def test_a_failed_claim_gives_its_connection_back_and_the_next_claim_takes_another(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    first, second, third = await _read_one_by_one(effects, redis, wsettings.redis_prefix, 3)
    kwargs = {"autocommit": True, "application_name": APP}
    async with AsyncConnectionPool(database_url, min_size=1, max_size=2, kwargs=kwargs) as pool:
        claimer = Claimer(pool, worker_id=WORKER, lease=30)
        assert len((await claimer.claim(first)).run) == 1
        await effects.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (APP,)
        )
        await effects.commit()
        await pool.check()  # the idle ones replaced; the kept one is not the pool's to check
        with pytest.raises(psycopg.OperationalError):
            await claimer.claim(second)
        assert len((await claimer.claim(third)).run) == 1
        assert len((await claimer.claim(second)).run) == 1  # its entry, read again: nothing was lost
        await claimer.close()
    assert await _states(effects) == [("running", 3)]


async def test_the_kept_connection_is_renewed_after_a_while(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    reads = await _read_one_by_one(effects, redis, wsettings.redis_prefix, 3)
    now = [1000.0]
    async with AsyncConnectionPool(database_url, min_size=1, kwargs={"autocommit": True}) as pool:
        claimer = Claimer(pool, worker_id=WORKER, lease=30, renew_after=60.0, monotonic=lambda: now[0])
        await claimer.claim(reads[0])
        now[0] += 59.0
        await claimer.claim(reads[1])
        assert _checkouts(pool) == 1
        now[0] += 1.0
        await claimer.claim(reads[2])
        assert _checkouts(pool) == 2
        await claimer.close()
    assert await _states(effects) == [("running", 3)]
