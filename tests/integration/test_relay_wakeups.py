"""When the relay publishes: late commits, lost NOTIFYs, delayed jobs."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from tests.harness.relay import enqueue_sql, entries, entry_ids, running_relay, states
from tests.harness.wait import next_item, wait_event

pytestmark = pytest.mark.alone  # wake-up times within 0.2 s of the poll


async def test_late_commit_is_published_after_a_higher_id(
    settings: Settings, conn: psycopg.Connection[Any], database_url: str, redis: aioredis.Redis
) -> None:
    """Tx A inserts first (lower id) and stays open; B commits; B is published; A commits; A is published."""
    with psycopg.connect(database_url) as tx_a:
        [a] = [
            r[0]
            for r in tx_a.execute("SELECT postbox.enqueue('noop', '{}'::jsonb)").fetchall()  # not committed yet
        ]
        async with running_relay(settings) as (_relay, signals):
            assert signals.published is not None
            [b] = enqueue_sql(conn, 1)
            assert a < b
            assert await next_item(signals.published, 5) == [b]
            assert await entry_ids(redis, settings.redis_prefix) == [b]
            tx_a.commit()
            assert await next_item(signals.published, 5) == [a]
    assert await entry_ids(redis, settings.redis_prefix) == [a, b]
    assert states(conn) == {a: ("queued", 1), b: ("queued", 1)}


async def test_a_notify_lost_while_the_listener_reconnects_is_caught_by_the_poll(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    poll = 1.0
    slow = settings.model_copy(update={"poll_interval": poll})
    async with running_relay(slow) as (relay, signals):
        await wait_event(signals.listening, 10)
        assert signals.listening is not None and signals.published is not None
        assert relay.notifier is not None and relay.notifier.backend_pid is not None
        listener_pid = relay.notifier.backend_pid
        signals.listening.clear()
        conn.execute("SELECT pg_terminate_backend(%s)", (listener_pid,))
        conn.commit()
        start = time.monotonic()
        ids = enqueue_sql(conn, 1)  # its NOTIFY reaches no listener
        assert await next_item(signals.published, poll + 0.5) == ids
        elapsed = time.monotonic() - start
        await wait_event(signals.listening, 5)  # and the listener came back
        assert relay.notifier.backend_pid not in (None, listener_pid)
        # the new LISTEN works: a fresh row is woken by its NOTIFY
        more = enqueue_sql(conn, 1)
        assert await next_item(signals.published, poll + 0.5) == more
    assert elapsed <= poll + 0.2
    assert await entry_ids(redis, settings.redis_prefix) == ids + more


async def test_delayed_job_is_published_within_a_second_of_its_time_not_before(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    """With a 10 s poll, only the relay's "next due row" wake-up can publish it in time."""
    slow = settings.model_copy(update={"poll_interval": 10.0})
    async with running_relay(slow, heartbeat_interval=10.0, epoch_check_interval=10.0) as (_relay, signals):
        await wait_event(signals.listening, 10)
        assert signals.published is not None
        [job] = enqueue_sql(conn, 1, delay=1.5)
        [now_job] = enqueue_sql(conn, 1)
        assert await next_item(signals.published, 5) == [now_job]
        assert await next_item(signals.published, 5) == [job]
    conn.commit()
    row = conn.execute(
        """SELECT extract(epoch FROM published_at - available_at)::float8,
                  (extract(epoch FROM available_at) * 1000)::int8
             FROM postbox.outbox WHERE id = %s""",
        (job,),
    ).fetchone()
    assert row is not None
    lateness, due_ms = row
    assert 0 <= lateness < 1.0  # marked after its time, within a second
    [entry] = [e for e in await entries(redis, settings.redis_prefix) if e["id"] == job]
    assert entry["pub"] >= due_ms  # and XADDed no earlier than its time
    assert await entry_ids(redis, settings.redis_prefix) == [job, now_job]
