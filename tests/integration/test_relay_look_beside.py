"""On one server the leader's look at its streams runs beside the publishing (relay/reconciler.py, check).

A look held open (the ``before_look`` test hook) must not hold back jobs committed
meanwhile, and a loss the look finds must be acted on at once, not at the next
due check.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.relay.scheduler import ScheduleDuty
from postbox.relay.service import Relay, RelaySignals
from postbox.settings import Settings
from postbox.streams import stream_key
from tests.harness.relay import enqueue_sql, entries, lose_prefix, running_relay
from tests.harness.wait import wait_event, wait_until_async
from tests.integration.test_relay_lost_tail import forget_first_check, lose_tail


class HeldLooks:
    """``before_look``: each look waits until released; ``begun`` counts the looks that started."""

    def __init__(self) -> None:
        self.begun = 0
        self.release = asyncio.Event()

    async def __call__(self) -> None:
        self.begun += 1
        await self.release.wait()


def signals_with(looks: HeldLooks) -> RelaySignals:
    signals = RelaySignals.all()
    signals.before_look = looks
    return signals


async def test_jobs_are_published_while_a_look_at_the_streams_is_under_way(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    looks = HeldLooks()
    options = {"epoch_check_interval": 0.05, "sweep_interval": 3600, "sweep_min_age": 3600}
    async with running_relay(settings, signals=signals_with(looks), **options) as (relay, _signals):
        enqueue_sql(conn, 2)
        await wait_until_async(lambda: relay.published_total == 2, 10, message="2 published")
        await wait_until_async(lambda: looks.begun >= 1, 10, message="a look under way")
        for expected in (5, 8):  # the look stays held the whole time: it is not in the publishing's way
            enqueue_sql(conn, 3)
            await wait_until_async(lambda n=expected: relay.published_total == n, 10, message=f"{expected} published")
        assert looks.begun == 1  # no second look while the first is under way
        assert relay.reconciler is not None and relay.reconciler.landed() is False
        looks.release.set()
        await wait_until_async(lambda: looks.begun >= 2, 10, message="the next look, once the first was judged")


async def test_a_loss_a_look_beside_the_publishing_finds_is_acted_on_at_once(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing else wakes the loop for half a minute (no poll, no heartbeat, no periodic schedules' look,
    the next check a minute away): the look that found the loss does."""
    monkeypatch.setattr(ScheduleDuty, "wait_hint", lambda _self: None)
    prefix = settings.redis_prefix
    looks = HeldLooks()
    looks.release.set()
    quiet = settings.model_copy(update={"poll_interval": 30.0, "relay_session_timeout": 120.0})
    options = {"epoch_check_interval": 0.05, "heartbeat_interval": 30.0, "sweep_interval": 3600, "sweep_min_age": 3600}
    async with running_relay(quiet, signals=signals_with(looks), **options) as (relay, signals):
        ids = enqueue_sql(conn, 6)
        await wait_until_async(lambda: relay.published_total == 6, 10, message="6 published")
        forget_first_check(signals)
        await wait_until_async(lambda: looks.begun >= 1, 10, message="looks beside the publishing")
        looks.release.clear()
        held = looks.begun
        await wait_until_async(lambda: looks.begun == held + 1, 10, message="a look held")
        relay.epoch_check_interval = 60.0  # the checks after this one are a minute apart
        assert signals.idle is not None
        signals.idle.clear()
        await wait_event(signals.idle, 10)  # the loop went to wait with the new interval, the look still held
        sids = [r[0] for r in conn.execute("SELECT stream_id FROM postbox.outbox ORDER BY id").fetchall()]
        conn.commit()
        await lose_tail(redis, stream_key(prefix, "default", 5), keep=sids[2])
        looks.release.set()
        await wait_event(signals.redis_loss, 5)
        assert relay.reconciler is not None and relay.reconciler.check_every(relay.epoch_check_interval) == 60.0
    conn.commit()
    counts = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
    # Nothing ran (no worker): every job queued when the loss was found is published again, once.
    assert [counts[i] for i in ids] == [2] * 6, counts


async def test_a_server_refusing_the_written_counter_gets_its_looks_before_the_publishing(
    settings: Settings, conn: psycopg.Connection[Any], private_redis: Any
) -> None:
    """Without the counter's INCRBY (an ACL) nothing would find a loss that the relay's own newer writes hide
    from a look running beside them: the looks stay in the publishing loop, as on a cluster."""
    admin = aioredis.Redis.from_url(private_redis.url, decode_responses=True)

    async def xinfo_calls() -> int:
        stats = await admin.info("commandstats")
        return int(stats.get("cmdstat_xinfo|stream", stats.get("cmdstat_xinfo", {})).get("calls", 0))

    looks = HeldLooks()
    looks.release.set()
    try:
        await admin.execute_command("ACL", "SETUSER", "relay", "on", ">pw", "~*", "&*", "+@all", "-incrby")
        limited = settings.model_copy(
            update={"redis_url": private_redis.url.replace("redis://", "redis://relay:pw@", 1)}
        )
        options = {"epoch_check_interval": 0.05, "sweep_interval": 3600, "sweep_min_age": 3600}
        async with running_relay(limited, signals=signals_with(looks), **options) as (relay, _signals):
            enqueue_sql(conn, 3)
            await wait_until_async(lambda: relay.published_total == 3, 10, message="3 published")
            before = await xinfo_calls()

            async def looked_again() -> bool:
                return await xinfo_calls() >= before + 3

            await wait_until_async(looked_again, 10, message="more looks at the streams, in the publishing loop")
            assert relay.reconciler is not None and not relay.reconciler.publisher.written.counting
        assert looks.begun == 0
    finally:
        await admin.aclose()


async def test_after_an_outage_redis_is_checked_before_anything_is_published(
    settings: Settings, conn: psycopg.Connection[Any], private_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis comes back empty from an outage with a job waiting: the loss is found before that job goes out,
    so it goes out once (a look beside the publishing would let it out first, into a stream with no group, and
    the written counter's short answer would start a recovery that sends it again)."""
    looks = HeldLooks()
    looks.release.set()
    on_private = settings.model_copy(update={"redis_url": private_redis.url})
    options = {"epoch_check_interval": 0.05, "sweep_interval": 3600, "sweep_min_age": 3600}
    async with running_relay(on_private, signals=signals_with(looks), **options) as (relay, signals):
        first = enqueue_sql(conn, 3)
        await wait_until_async(lambda: relay.published_total == 3, 10, message="3 published")
        await wait_until_async(lambda: looks.begun >= 1, 10, message="looks beside the publishing")
        assert signals.redis_loss is not None
        signals.redis_loss.clear()  # the first start (empty Redis) counted as a loss
        await asyncio.to_thread(private_redis.stop)
        [waiting] = enqueue_sql(conn, 1)
        await wait_until_async(
            lambda: any(r.getMessage() == "Redis unavailable" for r in caplog.records),
            10,
            message="the relay found Redis down",
        )
        await asyncio.to_thread(private_redis.start)
        await wait_event(signals.redis_loss, 10)
        sent = await sent_after_recovery(relay, private_redis.url, on_private.redis_prefix, waiting)
        # The three unfinished ones republished by the recovery, the waiting one sent once, nothing twice.
        assert sent == sorted([*first, waiting])
    conn.commit()
    [(count,)] = conn.execute("SELECT publish_count FROM postbox.outbox WHERE id = %s", (waiting,)).fetchall()
    assert count == 1


async def sent_after_recovery(relay: Relay, url: str, prefix: str, job: int) -> list[int]:
    """The ids of the jobs in the queue's streams, sorted, once ``job`` is among them and the recovery ended."""
    async with aioredis.Redis.from_url(url) as redis:

        async def sent() -> list[int]:
            return sorted(int(e["id"]) for e in await entries(redis, prefix))

        async def published() -> bool:
            return job in await sent()

        await wait_until_async(published, 10, message=f"job {job} published")
        await wait_until_async(
            lambda: relay.reconciler is not None and not relay.reconciler.recovering, 10, message="the recovery ended"
        )
        return await sent()


async def test_the_sweep_reads_the_epoch_itself_while_a_look_is_under_way(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    """Redis loses everything while the relay is idle (no write for the counter to show it) and a look beside
    the publishing is held: the sweep, finding the entries gone, must see the epoch gone too and leave the rows
    to the recovery, not send them itself into streams with no group (the recovery would send them again)."""
    looks = HeldLooks()
    looks.release.set()
    options = {"epoch_check_interval": 0.05, "sweep_interval": 0.2, "sweep_min_age": 0.3}
    async with running_relay(settings, signals=signals_with(looks), **options) as (relay, signals):
        ids = enqueue_sql(conn, 3)
        await wait_until_async(lambda: relay.published_total == 3, 10, message="3 published")
        forget_first_check(signals)
        looks.release.clear()
        held = looks.begun
        await wait_until_async(lambda: looks.begun == held + 1, 10, message="a look held")
        await lose_prefix(redis, settings.redis_prefix)
        await wait_event(signals.redis_loss, 10)
        await wait_until_async(lambda: relay.reconciler is not None and not relay.reconciler.recovering, 10)
        sent = [int(e["id"]) for e in await entries(redis, settings.redis_prefix)]
    conn.commit()
    assert sorted(sent) == ids  # each once, by the recovery
    counts = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
    assert [counts[i] for i in ids] == [2, 2, 2], counts


async def test_after_a_refused_batch_redis_is_checked_before_the_next_try(
    settings: Settings, conn: psycopg.Connection[Any], private_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every XADD refused (out of memory), then Redis loses its data and takes writes again: the loss is found
    before the refused job is tried again, so it goes out once. (The next due check is half a minute away.)"""
    on_private = settings.model_copy(update={"redis_url": private_redis.url})
    options = {"epoch_check_interval": 30.0, "sweep_interval": 3600, "sweep_min_age": 3600}
    admin = private_redis.client()
    async with running_relay(on_private, **options) as (relay, signals):
        first = enqueue_sql(conn, 2)
        await wait_until_async(lambda: relay.published_total == 2, 10, message="2 published")
        assert signals.redis_loss is not None
        signals.redis_loss.clear()  # the first start (empty Redis) counted as a loss
        admin.config_set("maxmemory", "1")  # (noeviction: writes refused with OOM)
        try:
            [refused] = enqueue_sql(conn, 1)
            await wait_until_async(
                lambda: any(r.getMessage() == "XADD refused" for r in caplog.records),
                10,
                message="the XADD refused",
            )
            admin.flushall()
        finally:
            admin.config_set("maxmemory", "0")
        await wait_event(signals.redis_loss, 10)
        sent = await sent_after_recovery(relay, private_redis.url, on_private.redis_prefix, refused)
        assert sent == sorted([*first, refused])  # each once
