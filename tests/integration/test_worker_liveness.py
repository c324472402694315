"""Heartbeats, leases, Redis group loss and metrics of the worker, on real servers."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import psycopg
import redis.asyncio as aioredis

from postbox.settings import Settings
from postbox.streams import queue_streams
from tests.harness.publish import publish_due
from tests.harness.redis_server import RedisServer
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue, fetch, fetchval, finished, running_worker, worker_settings


async def test_a_long_handler_keeps_its_claim_and_entry_fresh(
    settings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    s = worker_settings(settings, visibility_timeout=1.0, concurrency=1)
    aconn = effects
    job_id = await enqueue(aconn, t.w_slow_effect, {"seconds": 3.0})
    async with running_worker(s) as a, running_worker(s) as b:
        await publish_due(aconn, redis, s.redis_prefix)
        runner = a if await _claimed_by(a, 5) else b
        assert await finished(runner, 1, within=15) == [(job_id, "succeeded")]
        assert a.signals.reclaimed.qsize() == 0 and b.signals.reclaimed.qsize() == 0  # type: ignore[union-attr]
    assert await fetch(aconn, "SELECT state, attempts FROM postbox.outbox") == [("succeeded", 1)]
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 1


async def _claimed_by(worker: Any, within: float) -> bool:
    try:
        await asyncio.wait_for(worker.signals.claimed.get(), within / 2)
        return True
    except TimeoutError:
        return False


async def test_heartbeat_registry_row(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    s = worker_settings(settings, concurrency=7)
    async with running_worker(s) as worker:
        row = await fetch(
            aconn,
            "SELECT host, pid, queues, concurrency, in_flight, stopped_at FROM postbox.workers WHERE id = %s",
            (worker.id,),
        )
        assert row == [(socket.gethostname(), os.getpid(), [t.QUEUE], 7, 0, None)]
        first = await fetchval(aconn, "SELECT last_seen FROM postbox.workers WHERE id = %s", (worker.id,))
        job_id = await enqueue(aconn, t.w_slow_effect, {"seconds": 1.5})
        await aconn.execute(t.EFFECTS_DDL)
        await aconn.commit()
        await publish_due(aconn, redis, s.redis_prefix)
        await wait_until_async(
            lambda: fetchval(
                aconn, "SELECT in_flight = 1 AND last_seen > %s FROM postbox.workers WHERE id = %s", (first, worker.id)
            ),
            5,
            message="a heartbeat showing the job in flight",
        )
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    row = await fetch(aconn, "SELECT in_flight, processed, failed, stopped_at IS NOT NULL FROM postbox.workers")
    assert row == [(0, 1, 0, True)]


async def test_lost_consumer_group_is_recreated_and_consumption_goes_on(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    s = worker_settings(settings)
    async with running_worker(s) as worker:
        first = await enqueue(aconn, t.w_noop)
        await publish_due(aconn, redis, s.redis_prefix)
        assert await finished(worker, 1) == [(first, "succeeded")]
        await redis.delete(*queue_streams(s.redis_prefix, t.QUEUE))  # Redis lost the streams and groups
        second = await enqueue(aconn, t.w_noop)
        await publish_due(aconn, redis, s.redis_prefix)  # XADD recreates the stream, without a group
        assert await finished(worker, 1) == [(second, "succeeded")]


async def test_metrics_count_outcomes_by_queue_and_task(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    s = worker_settings(settings)
    await enqueue(aconn, t.w_add, {"a": 1, "b": 1})
    await enqueue(aconn, t.w_permanent)
    async with running_worker(s) as worker:
        await publish_due(aconn, redis, s.redis_prefix)
        await finished(worker, 2)
        registry = worker.metrics.registry

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, {"queue": t.QUEUE, **labels})

        assert sample("postbox_worker_jobs_total", task="w_add", outcome="started") == 1
        assert sample("postbox_worker_jobs_total", task="w_add", outcome="succeeded") == 1
        assert sample("postbox_worker_jobs_total", task="w_permanent", outcome="dead") == 1
        assert sample("postbox_worker_handler_seconds_count", task="w_add") == 1
        assert sample("postbox_worker_start_latency_seconds_count", task="w_permanent") == 1
        assert registry.get_sample_value("postbox_worker_in_flight") == 0
        names = {m.name for m in registry.collect()}
        assert names == {
            "postbox_worker_jobs",
            "postbox_worker_handler_seconds",
            "postbox_worker_start_latency_seconds",
            "postbox_worker_in_flight",
        }
        for metric in registry.collect():
            for s_ in metric.samples:
                assert set(s_.labels) <= {"queue", "task", "outcome", "le"}


async def test_lifecycle_events_are_published_only_while_someone_subscribes(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], private_redis: RedisServer
) -> None:
    """On a private Redis, PUBLISH calls are counted exactly: none without a subscriber."""
    from postbox import events
    from postbox.streams import events_channel

    def publishes() -> int:
        stats = private_redis.client().info("commandstats")
        return int(stats.get("cmdstat_publish", {}).get("calls", 0))

    s = worker_settings(settings.model_copy(update={"redis_url": private_redis.url}))
    redis = aioredis.Redis.from_url(private_redis.url)
    async with running_worker(s) as worker:
        worker._completer.events_check_interval = 0.0  # re-check subscribers at every flush
        first = await enqueue(aconn, t.w_noop)
        await publish_due(aconn, redis, s.redis_prefix)
        assert await finished(worker, 1) == [(first, "succeeded")]
        assert publishes() == 0  # nobody listened: no event was published

        pubsub = redis.pubsub()
        await pubsub.subscribe(events_channel(s.redis_prefix))
        try:
            second = await enqueue(aconn, t.w_noop)
            await publish_due(aconn, redis, s.redis_prefix)
            assert await finished(worker, 1) == [(second, "succeeded")]
            got: list[str] = []
            deadline = asyncio.get_running_loop().time() + 10
            while "succeeded" not in got and asyncio.get_running_loop().time() < deadline:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None:
                    evt = events.decode(message["data"])
                    got.append(evt["type"])
                    assert evt["job_id"] == second
            assert got == ["started", "succeeded"]
            assert publishes() == 2
        finally:
            await pubsub.aclose()
            await redis.aclose()


async def test_in_flight_gauge_follows_running_handlers_and_outcomes_count_per_batch(
    settings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    aconn = effects
    s = worker_settings(settings)
    for i in range(3):
        await enqueue(aconn, t.w_slow_effect, {"seconds": 0.5, "label": f"g{i}"})
    async with running_worker(s) as worker:
        registry = worker.metrics.registry
        await publish_due(aconn, redis, s.redis_prefix)
        await wait_until_async(lambda: registry.get_sample_value("postbox_worker_in_flight") == 3, 10)
        assert sorted(kind for _, kind in await finished(worker, 3)) == ["succeeded"] * 3
        assert registry.get_sample_value("postbox_worker_in_flight") == 0
        succeeded = {"queue": t.QUEUE, "task": "w_slow_effect", "outcome": "succeeded"}
        assert registry.get_sample_value("postbox_worker_jobs_total", succeeded) == 3
