"""The ready set: a read that can fill its count looks only at the streams the relay named.

On one server the relay adds each stream it XADDs to to ``<prefix>:ready``
and the read script takes out a stream it finds empty, so a read under a
backlog over many streams skips the empty ones without an XLEN each. A stream
outside the set holds only undelivered entries (a publish whose SADD has not
run yet, an older relay, a lost set): the walk of every stream that a read
makes when the set runs dry puts it back and reads it in the same call.
Counted on a private Redis (``INFO commandstats``), so no other client's
commands are in the figures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from postbox.streams import GROUP, encode_entry, ready_key, stream_key
from postbox.worker.consumer import Consumer, ensure_groups
from tests.harness.redis_server import RedisServer

PREFIX = "rs"
READY = ready_key(PREFIX)
STREAMS = [stream_key(PREFIX, f"q{q:02d}", p) for p in range(9, -1, -1) for q in range(20)]  # 200, priority order
CONSUMER = "worker-feed0001"


@pytest.fixture
async def client(private_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
    await ensure_groups(client, STREAMS)
    yield client
    await client.aclose()


async def add(client: aioredis.Redis, key: str, job_id: int, *, ready: bool) -> bytes:
    """XADD an entry; with ``ready``, then SADD its stream as the relay does."""
    fields = encode_entry(
        job_id=job_id, task="t", args="{}", headers="{}", attempt=0, queue="q", priority=0,
        enqueued_ms=1, published_ms=2,
    )  # fmt: skip
    entry_id: bytes = await client.xadd(key, fields)  # type: ignore[arg-type]
    if ready:
        await client.sadd(READY, key)
    return entry_id


async def calls(client: aioredis.Redis, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_read_that_fills_its_count_looks_only_at_the_streams_in_the_set(client: aioredis.Redis) -> None:
    last = STREAMS[-1]  # the lowest priority's last queue: every other stream comes before it
    for job_id in range(1, 6):
        await add(client, last, job_id, ready=True)
    with_set = Consumer(client, consumer=CONSUMER, ready=READY)
    await client.config_resetstat()
    got, _, tails = await with_set.read(STREAMS, 2)
    assert [d.job_id for d in got] == [1, 2] and tails == {}
    assert await calls(client, "xlen") == 1 and await calls(client, "xreadgroup") == 1  # the one stream in the set

    without = Consumer(client, consumer=CONSUMER)  # as on a cluster: an XLEN for every stream before it
    await client.config_resetstat()
    got, _, tails = await without.read(STREAMS, 2)
    assert [d.job_id for d in got] == [3, 4] and tails == {}
    assert await calls(client, "xlen") == len(STREAMS)


async def test_a_stream_outside_the_set_is_read_in_the_same_call_in_priority_order(client: aioredis.Redis) -> None:
    high, low = STREAMS[0], STREAMS[150]
    in_set = await add(client, low, 1, ready=True)
    newest = await add(client, high, 2, ready=False)  # its SADD has not run yet (or an older relay)
    consumer = Consumer(client, consumer=CONSUMER, ready=READY)
    got, _, tails = await consumer.read(STREAMS, 10)
    assert [(d.stream, d.job_id) for d in got] == [(high, 2), (low, 1)]  # one call, highest priority first
    assert await client.smembers(READY) == {high.encode(), low.encode()}
    assert tails[high] == newest.decode() and tails[low] == in_set.decode() and tails[STREAMS[1]] == "0-0"


async def test_a_stream_leaves_the_set_once_empty_and_stays_while_its_entries_are_in_flight(
    client: aioredis.Redis,
) -> None:
    stream = STREAMS[7]
    entry = await add(client, stream, 1, ready=True)
    consumer = Consumer(client, consumer=CONSUMER, ready=READY)
    got, _, _ = await consumer.read(STREAMS, 10)
    assert [d.job_id for d in got] == [1]

    # Delivered, not acknowledged: still in the set, and its tail is the entry (a wake-up after
    # it waits for a newer one: were it '0-0', the wait would answer at once, again and again).
    got, _, tails = await consumer.read(STREAMS, 10)
    assert got == [] and tails[stream] == entry.decode()
    assert await client.smembers(READY) == {stream.encode()}

    await client.xack(stream, GROUP, entry)
    await client.xdel(stream, entry)
    got, _, tails = await consumer.read(STREAMS, 10)
    assert got == [] and tails == dict.fromkeys(STREAMS, "0-0")
    assert await client.smembers(READY) == set()


async def test_a_lost_set_loses_nothing(client: aioredis.Redis) -> None:
    """Entries in flight and entries waiting, the set deleted: the waiting ones are read, no tail is '0-0'."""
    busy, waiting = STREAMS[3], STREAMS[60]
    in_flight = await add(client, busy, 1, ready=True)
    consumer = Consumer(client, consumer=CONSUMER, ready=READY)
    assert [d.job_id for d in (await consumer.read(STREAMS, 10))[0]] == [1]
    await add(client, waiting, 2, ready=True)
    await client.delete(READY)

    got, _, tails = await consumer.read(STREAMS, 10)
    assert [d.job_id for d in got] == [2]
    assert tails[busy] == in_flight.decode()  # back in the set, pending: a wake-up after its entry
    assert await client.smembers(READY) == {busy.encode(), waiting.encode()}


async def test_a_deleted_stream_in_the_set_is_taken_out_without_an_error(client: aioredis.Redis) -> None:
    gone, kept = STREAMS[1], STREAMS[2]
    await add(client, gone, 1, ready=True)
    await add(client, kept, 2, ready=True)
    await client.delete(gone)  # an operator's DEL: the stream and its group with it
    consumer = Consumer(client, consumer=CONSUMER, ready=READY)
    got, _, _ = await consumer.read(STREAMS, 10)
    assert [d.job_id for d in got] == [2]
    assert await client.smembers(READY) == {kept.encode()} and not await client.exists(gone)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_stream_left_out_of_the_set_is_read_in_its_turn_within_a_second_under_a_backlog(
    client: aioredis.Redis,
) -> None:
    """Reads that keep filling their count make no walk of every stream; once a second one checks the set
    first, so an entry whose SADD never ran (refused, an older relay) waits at most that, whatever the backlog."""
    high, low = STREAMS[0], STREAMS[150]
    clock = Clock()
    consumer = Consumer(client, consumer=CONSUMER, ready=READY, monotonic=clock)
    for job_id in range(1, 9):
        await add(client, low, job_id, ready=True)
    got, _, _ = await consumer.read(STREAMS, 2, whole=True)
    assert [d.job_id for d in got] == [1, 2]
    await add(client, high, 100, ready=False)
    clock.now += 0.5
    got, _, _ = await consumer.read(STREAMS, 2, whole=True)
    assert [d.job_id for d in got] == [3, 4]  # within the second: the set's streams only
    clock.now += 0.5
    await client.config_resetstat()
    got, _, _ = await consumer.read(STREAMS, 2, whole=True)
    assert [(d.stream, d.job_id) for d in got] == [(high, 100), (low, 5)]  # put back, and read in its turn
    assert await client.sismember(READY, high)
    assert await calls(client, "xlen") >= len(STREAMS) - 2  # the check's walk (the set's two members aside)
    await client.config_resetstat()
    got, _, _ = await consumer.read(STREAMS, 2, whole=True)
    assert [d.job_id for d in got] == [6, 7]
    assert await calls(client, "xlen") <= 2  # and not again within the second: the set's members only
