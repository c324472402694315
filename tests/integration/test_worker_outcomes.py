"""The worker on real PostgreSQL and Redis: outcomes, retries, dead letters, ctx, results."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

import jobs
from jobs.settings import Settings
from tests import tasks_worker as t
from tests.harness.publish import publish_due
from tests.worker_support import fetch, fetchval, finished, running_worker, worker_settings


@pytest.fixture
async def effects(aconn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    await aconn.execute(t.EFFECTS_DDL)
    await aconn.commit()
    return aconn


async def enqueue(aconn: psycopg.AsyncConnection[Any], task: Any, args: dict[str, Any] | None = None, **kw: Any) -> int:
    job_id = await jobs.enqueue_async(aconn, task, args, **kw)
    await aconn.commit()
    return job_id


async def test_success_is_recorded_and_acknowledged(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    s = worker_settings(settings)
    job_id = await enqueue(aconn, t.w_add, {"a": 2, "b": 3})
    async with running_worker(s) as worker:
        await publish_due(aconn, redis, s.redis_prefix)
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    row = await fetch(
        aconn, "SELECT state, attempts, result, claimed_by, lease_until, finished_at IS NOT NULL FROM outbox"
    )
    assert row == [("succeeded", 1, 5, None, None, True)]
    history = await fetch(aconn, "SELECT attempt, worker_id, outcome FROM job_attempts WHERE outbox_id = %s", (job_id,))
    assert history == [(1, worker.id, "succeeded")]
    stream = f"{s.redis_prefix}:{{{t.QUEUE}}}:p5"
    assert await redis.xlen(stream) == 0  # XACK + XDEL
    assert (await redis.xpending(stream, "postbox"))["pending"] == 0


async def test_retry_with_backoff_then_success(
    settings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    from relay import Relay

    s = worker_settings(settings)
    aconn = effects
    job_id = await enqueue(aconn, t.w_flaky, {"fail_times": 2})
    relay = Relay(s)
    import asyncio

    relay_task = asyncio.create_task(relay.run())
    try:
        async with running_worker(s) as worker:
            outcomes = await finished(worker, 3)
    finally:
        relay.stop()
        await relay_task
    assert outcomes == [(job_id, "retry"), (job_id, "retry"), (job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts, result FROM outbox") == [("succeeded", 3, "ok on attempt 3")]
    history = await fetch(
        aconn, "SELECT attempt, outcome, error_class FROM job_attempts WHERE outbox_id = %s ORDER BY attempt", (job_id,)
    )
    assert history == [(1, "retry", "RuntimeError"), (2, "retry", "RuntimeError"), (3, "succeeded", None)]
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 1
