"""The handlers' line for their connections: ctx.transaction()s past the pool's share wait in the worker's line."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from postbox.worker.worker import HANDLER_CONNECTIONS, OWN_CONNECTIONS, handler_gate
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue, fetchval, finished, running_worker, worker_settings


def waiting(gate: asyncio.Semaphore) -> int:
    """Jobs waiting in the line now (asyncio keeps them in the semaphore's deque of waiters)."""
    return len(getattr(gate, "_waiters", None) or ())


async def test_the_line_is_as_wide_as_the_handlers_share_of_the_pool() -> None:
    for concurrency, width in ((1, 1), (HANDLER_CONNECTIONS, HANDLER_CONNECTIONS), (500, HANDLER_CONNECTIONS)):
        gate = handler_gate(concurrency)
        for _ in range(width):
            await gate.acquire()
        assert gate.locked(), concurrency


@pytest.fixture
def held() -> Any:
    t.held_release = asyncio.Event()
    yield t.held_release
    t.held_release.set()
    t.held_release = None
    t.held_inside.clear()


async def test_transactions_past_the_pools_share_wait_in_the_workers_line_not_in_the_pools(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, held: asyncio.Event
) -> None:
    jobs = HANDLER_CONNECTIONS + 5
    ids = [await enqueue(aconn, t.w_held_in_transaction) for _ in range(jobs)]
    async with running_worker(worker_settings(wsettings, concurrency=jobs)) as worker:
        gate = worker._executor._transactions
        assert isinstance(gate, asyncio.Semaphore)
        await publish_due(aconn, redis, wsettings.redis_prefix)
        pool = worker._pool

        def parked() -> int:  # the five jobs with no connection: in psycopg_pool's line or in the worker's
            return pool.get_stats().get("requests_waiting", 0) + waiting(gate)

        await wait_until_async(
            lambda: len(t.held_inside) == HANDLER_CONNECTIONS and parked() == 5,
            message=lambda: f"{len(t.held_inside)} jobs inside, {parked()} waiting",
        )
        assert waiting(gate) == 5
        assert pool.get_stats().get("requests_waiting", 0) == 0
        assert pool.max_size == HANDLER_CONNECTIONS + OWN_CONNECTIONS
        held.set()
        outcomes = await finished(worker, jobs)
    assert sorted(outcomes) == sorted((job_id, "succeeded") for job_id in ids)
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == jobs
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == jobs
