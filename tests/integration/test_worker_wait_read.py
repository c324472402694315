"""The wake-up and the read in one send (Consumer.wait_then_read): entries come with the wake-up.

The worker sends its blocked XREAD and the read script behind it together; Redis
runs the script as soon as the XREAD answers. These tests hold what that must
keep: the read's priority order and count, the tails, a lost script or group, a
dropped connection, and the two ends of a wait that are not an entry: a stop and
a pause, each ended at once with ``CLIENT UNBLOCK`` so that nothing the read
takes is left behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from postbox.streams import encode_entry, stream_key
from postbox.worker import worker as worker_module
from postbox.worker.consumer import Consumer, ensure_groups
from tests.harness.publish import publish_due
from tests.harness.redis_server import RedisServer
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue, finished, job_state, running_worker
from tests.integration.test_worker_consumer import add

CONSUMER = "worker-wa17ead0"


def entry(job_id: int, priority: int) -> Any:
    return encode_entry(
        job_id=job_id, task="t", args="{}", headers="{}", attempt=0, queue="q", priority=priority,
        enqueued_ms=1, published_ms=2,
    )  # fmt: skip


async def blocked(client: aioredis.Redis) -> int:
    info = await client.info("clients")
    return int(info["blocked_clients"])


async def drained(client: aioredis.Redis, key: str) -> tuple[Consumer, dict[str, str]]:
    """A consumer of ``key``'s group, and the tails its first read (of nothing) reports."""
    await ensure_groups(client, [key])
    consumer = Consumer(client, consumer=CONSUMER)
    _, _, tails = await consumer.read([key], 5)
    return consumer, tails


async def wait_blocked(client: aioredis.Redis) -> None:
    async def check() -> bool:
        return await blocked(client) == 1

    await wait_until_async(check, 10, message="the wake-up is blocked in Redis")


async def test_entries_added_during_the_wait_come_with_the_wake_up_in_priority_order(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=30)
    high, low = stream_key("p", "q", 9), stream_key("p", "q", 1)
    streams = [high, low]
    try:
        await ensure_groups(client, streams)
        consumer = Consumer(client, consumer=CONSUMER)
        got, _, tails = await consumer.read(streams, 5)
        assert got == [] and tails == dict.fromkeys(streams, "0-0")

        # The timeout: the read behind it runs all the same and reports the tails again.
        got, malformed, tails = await consumer.wait_then_read(tails, streams, 5, 0.05)
        assert (got, malformed, tails) == ([], [], dict.fromkeys(streams, "0-0"))

        waiting = asyncio.ensure_future(consumer.wait_then_read(tails, streams, 5, 20))
        await wait_blocked(client)
        # Both in one MULTI: the wake-up answers once, and the read behind it takes both.
        async with client.pipeline(transaction=True) as pipe:
            pipe.xadd(low, entry(1, 1))
            pipe.xadd(high, entry(2, 9))
            low_id, high_id = await pipe.execute()
        got, malformed, tails = await asyncio.wait_for(waiting, 10)
        assert [(d.stream, d.job_id) for d in got] == [(high, 2), (low, 1)] and malformed == []
        assert tails == {high: high_id.decode(), low: low_id.decode()}  # fewer than 5: drained
        pending = await client.xpending(low, "postbox")
        assert pending["pending"] == 1  # delivered to the group: the worker owns it now

        # The count holds: three new entries, a read of two, no tails (more may be waiting).
        waiting = asyncio.ensure_future(consumer.wait_then_read(tails, streams, 2, 20))
        await wait_blocked(client)
        async with client.pipeline(transaction=True) as pipe:
            for job_id in (3, 4, 5):
                pipe.xadd(low, entry(job_id, 1))
            await pipe.execute()
        got, _, tails = await asyncio.wait_for(waiting, 10)
        assert [d.job_id for d in got] == [3, 4] and tails == {}
        got, _, _ = await consumer.read(streams, 5)
        assert [d.job_id for d in got] == [5]
        await consumer.close()
    finally:
        await client.aclose()


async def test_a_lost_script_and_a_lost_group_are_restored_by_the_read(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=30)
    key = stream_key("lost", "q", 5)
    try:
        consumer, tails = await drained(client, key)
        await client.script_flush()
        await client.delete(key)  # Redis lost its data: no stream, no group
        waiting = asyncio.ensure_future(consumer.wait_then_read(tails, [key], 5, 20))
        await wait_blocked(client)
        await add(client, key, 7, 5)
        got, _, _ = await asyncio.wait_for(waiting, 10)
        assert [d.job_id for d in got] == [7]
        groups = await client.xinfo_groups(key)
        assert [g["name"] for g in groups] == [b"postbox"]
        await consumer.close()
    finally:
        await client.aclose()


async def test_interrupt_ends_a_long_wait_at_once_also_after_the_connection_was_dropped(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=120)
    key = stream_key("int", "q", 5)
    try:
        consumer, tails = await drained(client, key)
        for round_ in (1, 2):
            started = time.monotonic()
            waiting = asyncio.ensure_future(consumer.wait_then_read(tails, [key], 5, 60))
            await wait_blocked(client)
            await consumer.interrupt_wait()
            got, _, again = await asyncio.wait_for(waiting, 10)
            assert got == [] and again == tails, round_
            assert time.monotonic() - started < 20, round_  # not the 60 s block
            assert await blocked(client) == 0
            if round_ == 1:
                # The wait's connection is killed between waits: the next wait opens it again,
                # and the interrupt reaches the new connection (its new client id).
                killed = await client.client_kill_filter(skipme=True, _type="normal")
                assert killed >= 1
        await consumer.close()
    finally:
        await client.aclose()


async def test_a_stop_ends_a_wait_in_the_callers_task_and_the_read_behind_it_still_answers(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=120)
    key = stream_key("stop", "q", 5)
    try:
        consumer, tails = await drained(client, key)
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # An entry comes first: the wait answers with it, and the stop is not touched.
        waiting = asyncio.ensure_future(consumer.wait_then_read_until(tails, [key], 5, 60, stop, 60))
        await wait_blocked(client)
        await add(client, key, 3, 5)
        got, _, tails = await asyncio.wait_for(waiting, 10)
        assert [d.job_id for d in got] == [3]
        # Then a stop: the wait ends at once, as at its timeout, and reports the tails.
        started = time.monotonic()
        waiting = asyncio.ensure_future(consumer.wait_then_read_until(tails, [key], 5, 60, stop, 60))
        await wait_blocked(client)
        stop.set_result(None)
        got, _, again = await asyncio.wait_for(waiting, 20)
        assert got == [] and again == tails
        assert time.monotonic() - started < 20  # not the 60 s block
        assert await blocked(client) == 0
        await consumer.close()
    finally:
        await client.aclose()


async def test_a_wait_the_stop_cannot_end_is_dropped_after_the_grace(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLIENT UNBLOCK never lands (here: never sent): after the grace the wait goes with its connection."""
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=120)
    key = stream_key("grace", "q", 5)
    try:
        consumer, tails = await drained(client, key)
        sent: list[float] = []

        async def lost() -> None:
            sent.append(time.monotonic())

        monkeypatch.setattr(consumer, "interrupt_wait", lost)
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(consumer.wait_then_read_until(tails, [key], 5, 60, stop, 1.0))
        await wait_blocked(client)
        stopping = time.monotonic()
        stop.set_result(None)
        assert await asyncio.wait_for(waiting, 20) == ([], [], {})
        assert 0.9 < time.monotonic() - stopping < 15  # the grace, not the 60 s block
        assert len(sent) >= 2  # asked again while the wait went on

        async def unblocked() -> bool:
            return await blocked(client) == 0

        await wait_until_async(unblocked, 10, message="the dropped connection's wait is gone from Redis")
        # The consumer waits again on a new connection, and an entry still wakes it.
        waiting = asyncio.ensure_future(consumer.wait_then_read(tails, [key], 5, 20))
        await wait_blocked(client)
        await add(client, key, 9, 5)
        got, _, _ = await asyncio.wait_for(waiting, 10)
        assert [d.job_id for d in got] == [9]
        await consumer.close()
    finally:
        await client.aclose()


async def test_an_idle_worker_stops_at_once_though_its_wait_blocks_for_a_minute(
    wsettings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "IDLE_BLOCK", 60.0)
    monkeypatch.setattr(worker_module, "UNBLOCK_GRACE", 60.0)  # the interrupt ends it, not the grace
    async with running_worker(wsettings) as worker:
        await wait_until_async(lambda: worker._consumer._waiting is not None, 20, message="the worker waits")
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 15  # the block is 60 s


async def test_a_pause_ends_the_wait_so_the_paused_queue_is_not_read_and_runs_at_once_when_resumed(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait that began before the pause covered the paused queue's streams: it is ended and begun again
    without them. Left blocked, it would take the paused queue's next entry and leave it pending (its job
    then waits for the visibility timeout, 60 s here, after the resume)."""
    monkeypatch.setattr(worker_module, "IDLE_BLOCK", 60.0)
    settings = wsettings.model_copy(update={"queues": [t.QUEUE, "other"], "visibility_timeout": 60.0})
    async with running_worker(settings) as worker:
        await wait_until_async(lambda: worker._consumer._waiting is not None, 20, message="the worker waits")
        await aconn.execute("INSERT INTO postbox.queues (name, paused) VALUES (%s, true)", (t.QUEUE,))
        await aconn.commit()
        await wait_until_async(lambda: t.QUEUE in worker.paused, 30, message="pause noticed")
        paused_job = await enqueue(aconn, t.w_noop)
        await publish_due(aconn, redis, settings.redis_prefix)
        # Another queue's job runs: the worker woke and read after the paused job's entry was added.
        other_job = await enqueue(aconn, t.w_noop, queue="other")
        await publish_due(aconn, redis, settings.redis_prefix)
        assert await finished(worker, 1) == [(other_job, "succeeded")]
        assert await job_state(aconn, paused_job) == "queued"
        stream = stream_key(settings.redis_prefix, t.QUEUE, 5)
        assert (await redis.xpending(stream, "postbox"))["pending"] == 0  # unread, not left pending

        await aconn.execute("UPDATE postbox.queues SET paused = false WHERE name = %s", (t.QUEUE,))
        await aconn.commit()
        resumed = time.monotonic()
        assert await finished(worker, 1, within=20) == [(paused_job, "succeeded")]
        assert time.monotonic() - resumed < 15  # not the 60 s visibility timeout


@pytest.mark.parametrize("refused", ["-client", "-client|unblock"])
async def test_a_user_without_client_unblock_waits_and_reads_apart(private_redis: RedisServer, refused: str) -> None:
    """An ACL that refuses CLIENT ID or CLIENT UNBLOCK: a wait the consumer could not end is never made."""
    admin = aioredis.Redis.from_url(private_redis.url, socket_timeout=30)
    user = f"limited{refused.replace('|', '_').replace('-', '')}"
    key = stream_key("acl", "q", 5)
    try:
        await admin.execute_command("ACL", "SETUSER", user, "on", "nopass", "~*", "&*", "+@all", refused)
        await ensure_groups(admin, [key])
        client = aioredis.Redis.from_url(private_redis.url, socket_timeout=30, username=user, password="")
        try:
            consumer = Consumer(client, consumer=CONSUMER)
            _, _, tails = await consumer.read([key], 5)
            assert consumer.reads_on_wake([key])
            await add(admin, key, 9, 5)  # waiting: a wait would answer at once and its read take this
            got, _, again = await consumer.wait_then_read(tails, [key], 5, 0.05)
            assert (got, again) == ([], tails)  # nothing waited, nothing read
            assert not consumer.reads_on_wake([key])
            # The worker then waits apart (a plain XREAD) and reads after it.
            assert await consumer.wait_for_new(tails, 5) == {key}
            got, _, _ = await consumer.read([key], 5)
            assert [d.job_id for d in got] == [9]
            await consumer.close()
        finally:
            await client.aclose()
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
