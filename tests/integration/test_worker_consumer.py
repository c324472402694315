"""The worker's read script, sent as a raw EVALSHA: priority order, count, tails, a lost script or group."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from postbox.streams import encode_entry, stream_key
from postbox.worker import consumer as consumer_module
from postbox.worker.consumer import Consumer, ensure_groups
from tests.harness.redis_server import RedisServer
from tests.harness.wait import wait_until_async


async def add(client: aioredis.Redis, key: str, job_id: int, priority: int) -> bytes:
    fields = encode_entry(
        job_id=job_id, task="t", args="{}", headers="{}", attempt=0, queue="q", priority=priority,
        enqueued_ms=1, published_ms=2,
    )  # fmt: skip
    return await client.xadd(key, fields)  # type: ignore[arg-type]


async def test_reads_highest_priority_first_up_to_count_then_reports_tails(private_redis: RedisServer) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
    high, low = stream_key("p", "q", 9), stream_key("p", "q", 1)
    try:
        await ensure_groups(client, [high, low])
        for job_id in (1, 2):
            await add(client, low, job_id, 1)
        last_high = await add(client, high, 3, 9)
        consumer = Consumer(client, consumer="worker-c0ffee00")
        got, malformed, tails = await consumer.read([high, low], 2)
        assert [(d.stream, d.job_id) for d in got] == [(high, 3), (low, 1)] and malformed == []
        assert tails == {}  # the count was reached: more may be waiting
        got, _, tails = await consumer.read([high, low], 5)
        assert [d.job_id for d in got] == [2]
        assert tails[high] == last_high.decode() and set(tails) == {high, low}

        # Redis restarted without the script and without the streams' groups: both come back
        await client.script_flush()
        await client.delete(high, low)
        await add(client, low, 4, 1)
        got, _, _ = await consumer.read([high, low], 5)
        assert [d.job_id for d in got] == [4]
    finally:
        await client.aclose()


@pytest.mark.parametrize("ready", [False, True])
async def test_a_group_lost_partway_through_a_read_does_not_strand_what_the_read_took_before_it(
    private_redis: RedisServer, ready: bool
) -> None:
    """A lower priority's stream deleted and made again by a relay's XADD, without its group: the read takes the
    higher one's entry, finds the group missing, makes it and reads on, and returns both (the entry taken first
    would otherwise stay pending, delivered to nobody, until the visibility timeout)."""
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
    high, low = stream_key("p", "q", 9), stream_key("p", "q", 1)
    set_key = "p:ready"
    try:
        await ensure_groups(client, [high, low])
        await add(client, high, 1, 9)
        await client.delete(low)
        await add(client, low, 2, 1)  # no group now
        if ready:
            await client.sadd(set_key, high, low)
        consumer = Consumer(client, consumer="worker-c0ffee00", ready=set_key if ready else None)
        got, _, _ = await consumer.read([high, low], 5, whole=True)
        assert [(d.stream, d.job_id) for d in got] == [(high, 1), (low, 2)]
        for key in (high, low):
            assert (await client.xpending(key, "postbox"))["pending"] == 1  # each delivered once, to this read
    finally:
        await client.aclose()


async def test_a_wake_up_names_the_streams_that_answered(private_redis: RedisServer) -> None:
    """The worker's next read looks only at the streams a wake-up named; at the timeout it names none."""
    for protocol in (2, 3):  # a map (RESP3, redis-py's default) or pairs (RESP2)
        client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5, protocol=protocol)
        high, mid, low = (stream_key(f"w{protocol}", "q", p) for p in (9, 5, 1))
        try:
            await ensure_groups(client, [high, mid, low])
            consumer = Consumer(client, consumer="worker-c0ffee00")
            got, _, tails = await consumer.read([high, mid, low], 5)
            assert got == [] and tails == dict.fromkeys([high, mid, low], "0-0")
            assert await consumer.wait_for_new(tails, 0.05) == set()  # nothing came: the timeout
            await add(client, low, 1, 1)
            await add(client, high, 2, 9)
            assert await consumer.wait_for_new(tails, 5) == {high, low}  # already there: both answer

            got, _, tails = await consumer.read([high, mid, low], 5)
            assert [d.job_id for d in got] == [2, 1]
            waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 5))
            await asyncio.sleep(0.2)  # most likely blocked by now; the answer is the same if not
            assert not waiting.done()
            await add(client, mid, 3, 5)
            assert await asyncio.wait_for(waiting, 5) == {mid}
            got, _, _ = await consumer.read([mid], 5)
            assert [d.job_id for d in got] == [3]
        finally:
            await client.aclose()


async def test_wake_up_reads_block_in_groups_and_only_the_one_that_answered_ends(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Groups that did not answer stay blocked for the next wait (Redis re-registers only one group's keys)."""
    monkeypatch.setattr(consumer_module, "WAIT_GROUP", 1)  # a group per stream: three blocked reads
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
    high, mid, low = (stream_key("g", "q", p) for p in (9, 5, 1))
    consumer = Consumer(client, consumer="worker-c0ffee00")
    try:
        await ensure_groups(client, [high, mid, low])
        _, _, tails = await consumer.read([high, mid, low], 5)
        waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30))
        await wait_until_async(lambda: blocked(client, 3), 10, message="three reads blocked")
        await add(client, mid, 1, 5)
        assert await asyncio.wait_for(waiting, 10) == {mid}
        assert await blocked(client, 2)  # high's and low's reads are still blocked

        got, _, new_tails = await consumer.read([high, mid, low], 5)
        assert [d.job_id for d in got] == [1]
        waiting = asyncio.ensure_future(consumer.wait_for_new(new_tails, 30))
        await wait_until_async(lambda: blocked(client, 3), 10, message="mid's read blocked again")
        await add(client, low, 2, 1)  # caught by low's read, blocked since the first wait
        assert await asyncio.wait_for(waiting, 10) == {low}
        await consumer.cancel_waits()
        await wait_until_async(lambda: blocked(client, 0), 10, message="every read ended")
    finally:
        await consumer.cancel_waits()
        await client.aclose()


async def test_a_stop_ends_a_wait_in_groups_at_once_and_leaves_them_blocked_until_cancelled(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's stop future is waited on beside the groups (no task around the wait): None, and nothing lost."""
    monkeypatch.setattr(consumer_module, "WAIT_GROUP", 1)
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
    high, low = (stream_key("s", "q", p) for p in (9, 1))
    consumer = Consumer(client, consumer="worker-c0ffee00")
    try:
        await ensure_groups(client, [high, low])
        _, _, tails = await consumer.read([high, low], 5)
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30, stop))
        await wait_until_async(lambda: blocked(client, 2), 10, message="two reads blocked")
        stop.set_result(None)
        assert await asyncio.wait_for(waiting, 5) is None  # at once, not at the 30 s block
        assert await blocked(client, 2)  # still blocked: close() (cancel_waits) ends them
        await add(client, low, 1, 1)
        assert await consumer.wait_for_new(tails, 30, stop) is None  # a stop already done: no wait at all
        await consumer.cancel_waits()
        await wait_until_async(lambda: blocked(client, 0), 10, message="every read ended")
        got, _, _ = await consumer.read([high, low], 5)
        assert [d.job_id for d in got] == [1]  # the wake-up reads consumed nothing

        # A wake-up still answers as before when a stop future is given and not done.
        _, _, tails = await consumer.read([high, low], 5)
        live: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30, live))
        await wait_until_async(lambda: blocked(client, 2), 10, message="two reads blocked again")
        await add(client, high, 2, 9)
        assert await asyncio.wait_for(waiting, 10) == {high}
    finally:
        await consumer.cancel_waits()
        await client.aclose()


async def blocked(client: aioredis.Redis, count: int) -> bool:
    info = await client.info("clients")
    return int(info["blocked_clients"]) == count
