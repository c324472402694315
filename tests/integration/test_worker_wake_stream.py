"""A wait over many streams blocks on the wake-up stream: one key, its cursor, and the fallback for old relays.

Over more than ``WAIT_GROUP`` streams on one server, the consumer's wait is one
``XREAD BLOCK`` on ``<prefix>:wake`` after a cursor that the drained read of
every stream took in the same script run; the worker's own wait sends the
wake-up read script behind it (``wait_then_read``), which reads the streams
the entries name. The tests shrink ``WAIT_GROUP`` to 2 so three streams take
that path, and count blocked clients on a private Redis.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from postbox.streams import encode_entry, stream_key, wake_entry, wake_key
from postbox.worker import consumer as consumer_module
from postbox.worker.consumer import WAKE_OFF, Consumer, ensure_groups
from tests.harness.redis_server import RedisServer
from tests.harness.wait import wait_until_async

PREFIX = "wk"


async def add(client: aioredis.Redis, queue: str, priority: int, job_id: int, *, wake: bool = True) -> None:
    """An entry as the relay writes it: the XADD, then (``wake``) the wake-up entry naming its stream."""
    fields = encode_entry(
        job_id=job_id, task="t", args="{}", headers="{}", attempt=0, queue=queue, priority=priority,
        enqueued_ms=1, published_ms=2,
    )  # fmt: skip
    await client.xadd(stream_key(PREFIX, queue, priority), fields)  # type: ignore[arg-type]
    if wake:
        await wake_only(client, queue, priority)


async def wake_only(client: aioredis.Redis, queue: str, priority: int) -> None:
    parts = wake_entry([(queue, priority)])
    await client.xadd(wake_key(PREFIX), dict(zip(parts[::2], parts[1::2], strict=True)))


async def blocked(client: aioredis.Redis, count: int) -> bool:
    info = await client.info("clients")
    return int(info["blocked_clients"]) == count


async def woken(
    consumer: Consumer,
    client: aioredis.Redis,
    tails: dict[str, str],
    streams: list[str],
    entry: tuple[str, int, int],
    *,
    blocked_clients: int = 1,
    wake: bool = True,
) -> set[str] | None:
    """A wait started, seen blocked on ``blocked_clients`` connections, then ``entry`` written: its answer."""
    waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30, None, streams))
    await wait_until_async(
        lambda: blocked(client, blocked_clients), 10, message=f"{blocked_clients} blocked (the groups: one each)"
    )
    await add(client, *entry, wake=wake)
    return await asyncio.wait_for(waiting, 10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> aioredis.Redis:
    monkeypatch.setattr(consumer_module, "WAIT_GROUP", 2)  # three streams: the wake-up stream's path
    redis = aioredis.Redis.from_url(private_redis.url, socket_timeout=5)
    yield redis  # type: ignore[misc]
    await redis.aclose()


STREAMS = [stream_key(PREFIX, "a", 9), stream_key(PREFIX, "b", 9), stream_key(PREFIX, "a", 1)]


@pytest.fixture
async def consumer(client: aioredis.Redis) -> Consumer:
    """A consumer on the wake-up stream's path, its groups on the three streams made."""
    made = Consumer(client, consumer="worker-c0ffee00", wake_prefix=PREFIX)
    await ensure_groups(client, STREAMS)
    yield made  # type: ignore[misc]
    await made.close()


async def test_a_wait_over_many_streams_blocks_on_one_key_and_answers_with_the_streams_named(
    client: aioredis.Redis,
    consumer: Consumer,
) -> None:
    streams = list(STREAMS)
    got, _, tails = await consumer.read(streams, 5, whole=True)
    assert got == [] and set(tails) == set(streams)
    waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30, None, streams))
    await wait_until_async(lambda: blocked(client, 1), 10, message="one read blocked (not one per group)")
    await wake_only(client, "c", 5)  # another worker's queue: the wait goes on
    await add(client, "b", 9, 1)
    assert await asyncio.wait_for(waiting, 10) == {streams[1]}
    got, _, _ = await consumer.read([streams[1]], 5)
    assert [d.job_id for d in got] == [1]

    # The cursor moved past both entries: nothing new, so the next wait runs to its timeout.
    assert await consumer.wait_for_new(tails, 0.2, None, streams) == set()
    # An entry written while nobody waits is caught by the next wait at once.
    await add(client, "a", 1, 2)
    assert await asyncio.wait_for(consumer.wait_for_new(tails, 30, None, streams), 10) == {streams[2]}


async def test_the_cursor_is_taken_with_the_drained_read_so_an_entry_written_after_it_wakes_the_wait(
    client: aioredis.Redis,
    consumer: Consumer,
) -> None:
    """A read of a few streams (what a wake-up named) does not move the cursor; a whole drained read does."""
    streams = list(STREAMS)
    await add(client, "a", 9, 1)
    await add(client, "a", 1, 2)
    got, _, tails = await consumer.read(streams, 1, whole=True)  # the count reached: no cursor
    assert [d.job_id for d in got] == [1] and tails == {}
    got, _, tails = await consumer.read(streams, 5, whole=True)  # drained: the cursor is the newest entry
    assert [d.job_id for d in got] == [2]
    assert await consumer.wait_for_new(tails, 0.2, None, streams) == set()

    await add(client, "b", 9, 3)
    got, _, _ = await consumer.read([streams[0]], 5)  # a read of a named few: the cursor stays
    assert got == []
    assert await asyncio.wait_for(consumer.wait_for_new(tails, 30, None, streams), 10) == {streams[1]}

    # Another list of streams (the worker builds a new one when its paused queues change) is not
    # covered by the cursor: the wait is on the streams, in groups.
    got, _, tails = await consumer.read(streams, 5, whole=True)
    assert [d.job_id for d in got] == [3]
    assert consumer.reads_on_wake(streams)  # a wake-up came after the timeout: no missed one, the cursor kept
    fewer = streams[:2] + streams[2:]
    waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30, None, fewer))
    await wait_until_async(lambda: blocked(client, 2), 10, message="two groups of two and one")
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


async def test_entries_with_no_wake_up_entry_send_the_consumer_back_to_the_streams_for_a_while(
    client: aioredis.Redis,
) -> None:
    """A relay of an earlier version writes no wake-up entry: two timeouts, then waits on the streams themselves."""
    streams = list(STREAMS)
    clock = Clock()
    consumer = Consumer(client, consumer="worker-c0ffee00", wake_prefix=PREFIX, monotonic=clock)
    try:
        await ensure_groups(client, streams)
        _, _, tails = await consumer.read(streams, 5, whole=True)
        await add(client, "a", 9, 1, wake=False)
        assert await consumer.wait_for_new(tails, 0.2, None, streams) == set()  # missed: the timeout
        got, _, tails = await consumer.read(streams, 5, whole=True)
        assert [d.job_id for d in got] == [1]
        # Once may be a coincidence (a batch that Redis read in parts): the next wait is on the wake-up stream still.
        waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 1, None, streams))
        await wait_until_async(lambda: blocked(client, 1), 10, message="one read blocked: the wake-up stream's")
        await add(client, "a", 9, 11, wake=False)
        assert await asyncio.wait_for(waiting, 10) == set()  # missed again: the timeout
        got, _, tails = await consumer.read(streams, 5, whole=True)
        assert [d.job_id for d in got] == [11]
        assert await woken(consumer, client, tails, streams, ("a", 1, 2), blocked_clients=2, wake=False) == {streams[2]}
        got, _, tails = await consumer.read(streams, 5, whole=True)
        assert [d.job_id for d in got] == [2]
        await consumer.cancel_waits()

        clock.now += WAKE_OFF  # then the wake-up stream again, from the next drained whole read
        _, _, tails = await consumer.read(streams, 5, whole=True)
        assert await woken(consumer, client, tails, streams, ("b", 9, 3)) == {streams[1]}
    finally:
        await consumer.close()


async def test_an_entry_found_after_a_timeout_with_its_wake_up_entry_keeps_the_wake_up_stream(
    client: aioredis.Redis,
    consumer: Consumer,
) -> None:
    """Written between the timeout and the read after it, with its wake-up entry: not a missed wake-up."""
    streams = list(STREAMS)
    _, _, tails = await consumer.read(streams, 5, whole=True)
    assert await consumer.wait_for_new(tails, 0.2, None, streams) == set()
    await add(client, "a", 9, 1)
    got, _, tails = await consumer.read(streams, 5, whole=True)
    assert [d.job_id for d in got] == [1]
    assert await woken(consumer, client, tails, streams, ("a", 1, 2)) == {streams[2]}


async def test_a_resumed_queues_entries_found_after_a_timeout_are_not_a_missed_wake_up(
    client: aioredis.Redis,
    consumer: Consumer,
) -> None:
    """Entries written while the queue was paused came before the cursor: the new list of streams finds them."""
    streams = list(STREAMS)
    resumed = stream_key(PREFIX, "c", 5)
    await ensure_groups(client, [*streams, resumed])
    await add(client, "c", 5, 1)  # queue c paused: not among the streams read
    _, _, tails = await consumer.read(streams, 5, whole=True)
    assert await consumer.wait_for_new(tails, 0.2, None, streams) == set()
    with_resumed = [*streams, resumed]  # the worker's new list once c is resumed
    got, _, tails = await consumer.read(with_resumed, 5, whole=True)
    assert [d.job_id for d in got] == [1]
    assert await woken(consumer, client, tails, with_resumed, ("c", 5, 2)) == {resumed}


async def test_a_stop_ends_a_wait_on_the_wake_up_stream_at_once(client: aioredis.Redis, consumer: Consumer) -> None:
    streams = list(STREAMS)
    _, _, tails = await consumer.read(streams, 5, whole=True)
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(consumer.wait_for_new(tails, 30, stop, streams))
    await wait_until_async(lambda: blocked(client, 1), 10, message="one read blocked")
    stop.set_result(None)
    assert await asyncio.wait_for(waiting, 5) is None  # at once, not at the 30 s block
    await consumer.cancel_waits()
    await wait_until_async(lambda: blocked(client, 0), 10, message="the read ended")


async def test_the_relay_writes_one_wake_up_entry_per_write_naming_each_queue_once(client: aioredis.Redis) -> None:
    from postbox.relay.publisher import Publisher

    publisher = Publisher(client, PREFIX)
    rows = [
        (1, "a", "t", "{}", "{}", 9, 0, 1),
        (2, "a", "t", "{}", "{}", 1, 0, 1),
        (3, "b", "t", "{}", "{}", 9, 0, 1),
        (4, "a", "t", "{}", "{}", 9, 0, 1),
    ]
    ids, _, refused = await publisher.xadd_rows(rows)
    assert (ids, refused) == ([1, 2, 3, 4], [])
    [(_, fields)] = await client.xrange(wake_key(PREFIX))
    assert fields == {b"a": b"91", b"b": b"9"}
    assert await client.xlen(stream_key(PREFIX, "a", 9)) == 2


async def test_the_read_behind_the_wake_up_reads_the_named_streams_of_this_worker_in_priority_order(
    client: aioredis.Redis,
    consumer: Consumer,
) -> None:
    streams = list(STREAMS)
    await ensure_groups(client, [*streams, stream_key(PREFIX, "c", 5)])
    got, _, tails = await consumer.read(streams, 5, whole=True)
    assert got == [] and consumer.reads_on_wake(streams)
    waiting = asyncio.ensure_future(consumer.wait_then_read(tails, streams, 5, 30))
    await wait_until_async(lambda: blocked(client, 1), 10, message="one read blocked")
    await add(client, "c", 5, 1)  # another worker's queue: woken, nothing read, wait again
    assert await asyncio.wait_for(waiting, 10) == ([], [], tails)
    assert (await client.xpending(stream_key(PREFIX, "c", 5), "postbox"))["pending"] == 0  # not read

    await add(client, "a", 1, 2)
    await add(client, "b", 9, 3)
    await add(client, "a", 9, 4)
    got, malformed, after = await consumer.wait_then_read(tails, streams, 2, 30)  # there already: at once
    assert [(d.stream, d.job_id) for d in got] == [(streams[0], 4), (streams[1], 3)] and malformed == []
    assert after == {}  # the count was reached: the worker reads every stream next
    got, _, after = await consumer.read(streams, 5, whole=True)
    assert [d.job_id for d in got] == [2] and after

    await add(client, "a", 1, 5)
    got, _, after = await consumer.wait_then_read(after, streams, 5, 30)
    assert [d.job_id for d in got] == [5] and after  # drained: wait again


async def test_a_cursor_the_stream_was_trimmed_past_sends_the_worker_to_every_stream(
    client: aioredis.Redis, consumer: Consumer
) -> None:
    """A worker that did not wait while the relays wrote over a thousand batches (its capacity full) comes
    back to a cursor older than every wake-up entry kept: what the trimmed ones named is read all the same."""
    streams = list(STREAMS)
    await add(client, "b", 9, 1)
    got, _, tails = await consumer.read(streams, 5, whole=True)  # the cursor: that wake-up entry
    assert [d.job_id for d in got] == [1]
    [(cursor, _)] = await client.xrange(wake_key(PREFIX), count=1)
    await add(client, "a", 1, 2)  # its wake-up entry is trimmed below
    for _ in range(12):  # other queues' batches, as their relays write them
        async with client.pipeline(transaction=False) as pipe:
            for _ in range(100):
                parts = wake_entry([("c", 5)])
                pipe.xadd(wake_key(PREFIX), dict(zip(parts[::2], parts[1::2], strict=True)), maxlen=1000)
            await pipe.execute()
    assert await client.xrange(wake_key(PREFIX), cursor, cursor) == []  # trimmed past the cursor
    got, _, after = await consumer.wait_then_read(tails, streams, 5, 30)
    assert got == [] and after == {}  # the streams named after the cursor held nothing: read every stream next
    got, _, after = await consumer.read(streams, 5, whole=True)
    assert [d.job_id for d in got] == [2] and after


async def test_a_wait_whose_xread_is_refused_still_reads_and_is_not_sent_that_way_again(
    client: aioredis.Redis, private_redis: RedisServer
) -> None:
    """A Redis user that may not XREAD (an ACL): the read behind the refused wait runs at once; sending the
    same pair again would spin, so the consumer waits apart from then on (where a refusal is an error)."""
    await client.execute_command("ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all", "-xread")
    limited = aioredis.Redis.from_url(private_redis.url.replace("redis://", "redis://nowait:pw@"), socket_timeout=5)
    consumer = Consumer(limited, consumer="worker-c0ffee01", wake_prefix=PREFIX)
    try:
        streams = list(STREAMS)
        await ensure_groups(limited, streams)
        _, _, tails = await consumer.read(streams, 5, whole=True)
        assert consumer.reads_on_wake(streams)
        await add(client, "a", 9, 1)
        got, _, _ = await asyncio.wait_for(consumer.wait_then_read(tails, streams, 5, 30), 10)
        assert [d.job_id for d in got] == [1]
        assert not consumer.reads_on_wake(streams)
    finally:
        await consumer.close()
        await limited.aclose()


async def test_a_group_lost_partway_through_the_read_behind_a_wake_up_strands_nothing(
    client: aioredis.Redis, consumer: Consumer
) -> None:
    """The second stream a wake-up names was deleted and made again without its group: the read makes the group
    and returns both entries, the one it took before the loss too."""
    streams = list(STREAMS)
    _, _, tails = await consumer.read(streams, 5, whole=True)
    await add(client, "a", 9, 1)
    await client.delete(streams[1])
    await add(client, "b", 9, 2)  # a relay's XADD makes the stream again, without the group
    got, _, _ = await asyncio.wait_for(consumer.wait_then_read(tails, streams, 5, 30), 10)
    assert [(d.stream, d.job_id) for d in got] == [(streams[0], 1), (streams[1], 2)]
    assert (await client.xpending(streams[0], "postbox"))["pending"] == 1


async def test_a_wake_up_read_that_times_out_sends_the_worker_to_every_stream(
    client: aioredis.Redis, consumer: Consumer
) -> None:
    """No wake-up entry by the timeout: empty tails (read every stream); entries with none, twice, mean an old relay."""
    streams = list(STREAMS)
    _, _, tails = await consumer.read(streams, 5, whole=True)
    for job_id in (1, 2):
        assert consumer.reads_on_wake(streams)
        await add(client, "b", 9, job_id, wake=False)
        assert await consumer.wait_then_read(tails, streams, 5, 0.2) == ([], [], {})
        got, _, tails = await consumer.read(streams, 5, whole=True)
        assert [d.job_id for d in got] == [job_id]
    assert not consumer.reads_on_wake(streams)  # waits on the streams themselves now (more than one group)


async def test_a_stop_ends_a_wake_up_read_at_once_and_the_next_read_goes_on(
    client: aioredis.Redis, consumer: Consumer
) -> None:
    streams = list(STREAMS)
    _, _, tails = await consumer.read(streams, 5, whole=True)
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(consumer.wait_then_read_until(tails, streams, 5, 30, stop, 5))
    await wait_until_async(lambda: blocked(client, 1), 10, message="one read blocked")
    stop.set_result(None)
    assert await asyncio.wait_for(waiting, 5) == ([], [], {})  # at once, not at the 30 s block
    await add(client, "a", 9, 1)
    got, _, _ = await consumer.read(streams, 5, whole=True)
    assert [d.job_id for d in got] == [1]
