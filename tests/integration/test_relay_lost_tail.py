"""A failover to a replica that missed the last writes: the epoch and the streams survive, their tail does not.

Simulated on this test's own streams (the shared server is fine: only our prefix
is touched): the newest entries are deleted and the stream's last generated id
is set back (``XSETID``), which is what the promoted replica looks like. The
last test fails over a real primary/replica pair; so does, under load,
tests/system/test_redis_failover.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.relay.service import RelaySignals
from postbox.settings import Settings
from postbox.streams import GROUP, decode_entry, stream_key
from tests.harness.redis_failover import redis_pair
from tests.harness.relay import enqueue_sql, entries, running_relay
from tests.harness.wait import next_item, wait_event, wait_until_async


async def lose_tail(redis: aioredis.Redis, key: str, *, keep: str) -> None:
    """Make ``key`` what a replica that saw entries up to ``keep`` holds after its promotion.

    The stream is rebuilt from its entries up to ``keep`` (same ids), its last id
    and its group's last-delivered id at ``keep``. Rebuilt rather than XDEL + XSETID:
    since Redis 7.2 (and Valkey) XSETID refuses to go below the highest deleted id.
    Nothing was consumed in these tests, so the group has nothing pending to lose.
    """
    kept = await redis.xrange(key, "-", keep)
    await redis.delete(key)
    for entry_id, fields in kept:
        await redis.xadd(key, fields, id=entry_id)
    await redis.xgroup_create(key, GROUP, id=keep, mkstream=True)
    assert [e for e, _ in await redis.xrange(key)] == [e for e, _ in kept]


def forget_first_check(signals: RelaySignals) -> None:
    """The term's first check found no epoch (a fresh prefix) and fired ``redis_loss``: a later loss fires it again."""
    assert signals.redis_loss is not None and signals.redis_loss.is_set()
    signals.redis_loss.clear()


async def test_a_lost_stream_tail_is_found_by_the_high_water_mark_and_republished(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    prefix = settings.redis_prefix
    # No sweep during the test: only the loss check can find the lost tail.
    async with running_relay(settings, sweep_interval=3600, sweep_min_age=3600) as (relay, signals):
        ids = enqueue_sql(conn, 6)
        await wait_until_async(lambda: relay.published_total == 6, 10, message="6 published")
        forget_first_check(signals)
        sids = [r[0] for r in conn.execute("SELECT stream_id FROM postbox.outbox ORDER BY id").fetchall()]
        conn.commit()
        key = stream_key(prefix, "default", 5)
        await lose_tail(redis, key, keep=sids[2])  # the replica never saw the last three
        await wait_event(signals.redis_loss, 10)
        found: list[dict[str, Any]] = []

        async def refresh() -> bool:
            found[:] = await entries(redis, prefix)
            return set(ids[3:]) <= {int(e["id"]) for e in found}

        await wait_until_async(refresh, 10, message="the lost tail back in the stream")
    conn.commit()
    counts = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
    assert all(counts[i] == 2 for i in ids[3:]), counts


async def test_over_many_streams_the_check_looks_in_slices_and_still_finds_a_tail_lost_in_the_last(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    """150 streams, looked at in two slices (relay/stream_check.py): a loss in the second is found."""
    prefix = settings.redis_prefix
    queues = [f"q{i:02d}" for i in range(15)]
    async with running_relay(settings, sweep_interval=3600, sweep_min_age=3600) as (relay, signals):
        for queue in queues:
            for priority in range(10):
                enqueue_sql(conn, 1, queue=queue, priority=priority)
        last = enqueue_sql(conn, 1, queue=queues[-1], priority=9)
        await wait_until_async(lambda: relay.published_total == 151, 20, message="151 published")
        forget_first_check(signals)
        assert relay.reconciler is not None
        await wait_until_async(
            lambda: relay.reconciler is not None and relay.reconciler.check_every(1.0) == 0.5,
            10,
            message="the check in two slices",
        )
        key = stream_key(prefix, queues[-1], 9)  # the last stream in key order: in the second slice
        assert sorted(relay.reconciler.publisher.known_groups)[-1] == key
        [first, _] = [sid for sid, _ in await redis.xrange(key)]
        await lose_tail(redis, key, keep=first.decode())
        await wait_event(signals.redis_loss, 10)
        await wait_until_async(
            lambda: _stream_holds(redis, key, last[0]), 10, message="the lost entry back in the stream"
        )


async def _stream_holds(redis: aioredis.Redis, key: str, job_id: int) -> bool:
    return any(decode_entry(fields)["id"] == job_id for _, fields in await redis.xrange(key))


async def test_the_sweep_republishes_a_job_whose_entry_id_now_holds_another_job(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    prefix = settings.redis_prefix
    async with running_relay(settings, sweep_interval=0.2, sweep_min_age=0.3) as (relay, signals):
        first, second = enqueue_sql(conn, 2)
        await wait_until_async(lambda: relay.published_total == 2, 10, message="2 published")
        sids = dict(conn.execute("SELECT id, stream_id FROM postbox.outbox").fetchall())
        # After a failover the stream's ids restart from an older point: the id recorded
        # for ``first`` can come back holding another job's entry.
        assert await redis.xdel(stream_key(prefix, "default", 5), sids[first]) == 1
        conn.execute("UPDATE postbox.outbox SET stream_id = %s WHERE id = %s", (sids[second], first))
        conn.commit()
        assert signals.republished is not None
        got = await next_item(signals.republished, 10)
        assert got == [first]
    assert conn.execute("SELECT publish_count FROM postbox.outbox WHERE id = %s", (first,)).fetchone() == (2,)
    assert sorted(int(e["id"]) for e in await entries(redis, prefix)) == [first, second]


async def test_a_new_leader_notices_a_tail_lost_before_its_term_began(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    """The previous leader died with the Redis primary: its marks died with it; the new one's come from PostgreSQL."""
    prefix = settings.redis_prefix
    async with running_relay(settings, sweep_interval=3600, sweep_min_age=3600) as (relay, _signals):
        ids = enqueue_sql(conn, 6)
        await wait_until_async(lambda: relay.published_total == 6, 10, message="6 published")
    sids = [r[0] for r in conn.execute("SELECT stream_id FROM postbox.outbox ORDER BY id").fetchall()]
    conn.commit()
    key = stream_key(prefix, "default", 5)
    await lose_tail(redis, key, keep=sids[2])
    async with running_relay(settings, sweep_interval=3600, sweep_min_age=3600) as (_relay, signals):
        await wait_event(signals.redis_loss, 10)
        found: list[dict[str, Any]] = []

        async def refresh() -> bool:
            found[:] = await entries(redis, prefix)
            return set(ids[3:]) <= {int(e["id"]) for e in found}

        await wait_until_async(refresh, 10, message="the lost tail back in the stream")


async def test_a_server_that_refuses_xinfo_does_not_stop_publishing(
    settings: Settings, conn: psycopg.Connection[Any], private_redis: Any
) -> None:
    """An ACL (or a managed Redis) without XINFO, nor INCRBY for the written counter: the tail check is skipped,
    the counter's refusal ignored, and publishing goes on."""
    admin = aioredis.Redis.from_url(private_redis.url, decode_responses=True)

    async def refused(command: str) -> int:
        stats = await admin.info("commandstats")
        return sum(int(v.get("rejected_calls", 0)) for k, v in stats.items() if k.startswith(f"cmdstat_{command}"))

    try:
        await admin.execute_command("ACL", "SETUSER", "relay", "on", ">pw", "~*", "&*", "+@all", "-xinfo", "-incrby")
        limited = settings.model_copy(
            update={"redis_url": private_redis.url.replace("redis://", "redis://relay:pw@", 1)}
        )
        async with running_relay(limited, epoch_check_interval=0.05) as (relay, _):
            enqueue_sql(conn, 3)
            await wait_until_async(lambda: relay.published_total == 3, 10, message="first 3 published")
            await wait_until_async(lambda: refused("xinfo"), 10, message="a tail check refused by the ACL")
            enqueue_sql(conn, 3)
            await wait_until_async(lambda: relay.published_total == 6, 10, message="3 more published after the refusal")
            assert await refused("incrby") == 2  # the counter of each of the two batches, refused and ignored
            assert relay.reconciler is not None and not relay.reconciler.publisher.writes_lost
    finally:
        await admin.aclose()


async def test_a_failover_written_to_before_any_look_is_still_found_by_the_written_counter(
    settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real primary and replica. After the failover the first XADD gets an id from the clock, newer than the
    lost tail's: the look at ``last-generated-id`` is blind from then on. The batch's count is not."""
    prefix = settings.redis_prefix
    with redis_pair(tmp_path / "redis") as pair:
        on_pair = settings.model_copy(update={"redis_url": pair.url})
        # No look after the term's first and no sweep: only the written counter can find the loss.
        options = {"epoch_check_interval": 3600, "sweep_interval": 3600, "sweep_min_age": 3600}
        async with running_relay(on_pair, **options) as (relay, signals):
            ids = enqueue_sql(conn, 3)
            await wait_until_async(lambda: relay.published_total == 3, 10, message="3 published")
            forget_first_check(signals)
            await asyncio.to_thread(pair.wait_synced)
            await asyncio.to_thread(pair.detach_replica)
            ids += enqueue_sql(conn, 3)  # the tail the replica never gets
            await wait_until_async(lambda: relay.published_total == 6, 10, message="the tail published")
            await asyncio.to_thread(pair.fail_over)
            enqueue_sql(conn, 1)  # written to the promoted replica: its entry id is newer than the lost ones
            await wait_event(signals.redis_loss, 10)
            async with aioredis.Redis.from_url(pair.url) as redis:

                async def refresh() -> bool:
                    return set(ids[3:]) <= {int(e["id"]) for e in await entries(redis, prefix)}

                await wait_until_async(refresh, 10, message="the lost tail back in the stream")
        counts = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
        conn.commit()
    found = [r for r in caplog.records if r.getMessage().startswith("Redis lost the newest entries")]
    assert [getattr(r, "found_by", None) for r in found] == ["the written counter"]
    # Nothing ran (no worker): every job queued when the loss was found is published again, once.
    assert [counts[i] for i in ids] == [2] * 6, counts
