"""A one-job insert's notification carries the job; the relay publishes it before it selects (migration 0018).

The payload is only a head start: what the select would have published is
published once either way, and a payload the relay cannot trust (another
schema's, malformed, a job it may have sent already) is dropped.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import redis.asyncio as aioredis

import postbox
from postbox.relay.publisher import Publisher
from postbox.relay.service import Relay, RelaySignals
from postbox.settings import Settings
from tests.harness.relay import enqueue_sql, entries, running_relay
from tests.harness.tasks import core as tasks_core
from tests.harness.wait import wait_event, wait_until_async

# Wake-ups only from notifications, held marks and a heartbeat every 2 s (no poll, check or sweep for 30 s):
# a turn the test did not cause could select a job committed meanwhile before its notification is read.
QUIET = {"heartbeat_interval": 2.0, "epoch_check_interval": 30.0, "sweep_interval": 3600.0, "sweep_min_age": 3600.0}


def quiet(settings: Settings) -> Settings:
    return settings.model_copy(update={"poll_interval": 30.0})


async def until_idle(signals: RelaySignals) -> None:
    """Until the leader's loop waits with nothing in hand and no wake-up pending (after this call's start,
    and after the listener's first wake-up)."""
    assert signals.idle is not None and signals.listening is not None
    await wait_event(signals.listening, 10)
    signals.idle.clear()
    await wait_event(signals.idle, 10)


def publisher_of(relay: Relay) -> Publisher:
    assert relay.reconciler is not None
    return relay.reconciler.publisher


def payloads_of(conn: psycopg.Connection[Any], statement: Any, params: Any = None) -> list[str]:
    """The ``postbox_outbox`` payloads one committed statement sends."""
    with psycopg.connect(conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN postbox_outbox")
        conn.execute(statement, params)
        conn.commit()
        return [note.payload for note in listener.notifies(timeout=1.0, stop_after=10)]


def test_the_trigger_sends_a_one_job_insert_as_the_relays_select_returns_it_and_anything_else_empty(
    conn: psycopg.Connection[Any],
) -> None:
    enqueue = "SELECT postbox.enqueue('noop', %s::jsonb, 'default', 5, now() + make_interval(secs => %s))"
    [one] = payloads_of(conn, enqueue, ('{"n": 1, "s": "é\\"x"}', 0))
    job_id, created_ms = conn.execute(
        "SELECT id, (extract(epoch FROM created_at) * 1000)::int8 FROM postbox.outbox"
    ).fetchone()
    conn.commit()
    assert orjson.loads(one) == [
        "postbox",
        job_id,
        "default",
        "noop",
        '{"n": 1, "s": "é\\"x"}',
        "{}",
        5,
        0,
        created_ms,
        False,
    ]
    assert payloads_of(conn, enqueue, ("{}", 60)) == [""]  # delayed: not due yet
    assert payloads_of(conn, enqueue, (orjson.dumps({"big": "x" * 7000}).decode(), 0)) == [""]  # over 7,000 bytes
    two = payloads_of(
        conn, "INSERT INTO postbox.outbox (task, queue, args) SELECT 'noop', 'default', '{}' FROM generate_series(1, 2)"
    )
    assert two == [""]  # one statement, two rows


async def test_a_one_job_insert_is_published_from_its_notification_and_marked_as_a_selected_one(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    async with running_relay(quiet(settings), **QUIET) as (relay, signals):
        await until_idle(signals)
        [job_id] = enqueue_sql(conn, 1)
        await wait_until_async(lambda: relay.published_total == 1, 10, message="published")
        assert publisher_of(relay).notified_published == 1
        [entry] = await entries(redis, settings.redis_prefix)
        assert (entry["id"], entry["task"], entry["args"], entry["attempt"], entry["priority"]) == (
            job_id,
            "noop",
            "{}",
            1,
            5,
        )

        def marked() -> bool:
            row = conn.execute("SELECT state, stream_id, publish_count FROM postbox.outbox").fetchone()
            conn.commit()
            return row == ("queued", entry["_sid"], 1)

        await wait_until_async(marked, 10, message="the held mark")


async def test_a_bulk_delayed_or_large_job_is_selected_as_before(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    async with running_relay(settings) as (relay, _signals):
        with conn.transaction():
            bulk = postbox.enqueue_many(conn, [{"task": "noop"}] * 3)
        [delayed] = enqueue_sql(conn, 1, delay=0.3)
        with conn.transaction():
            large = postbox.enqueue(conn, tasks_core.send_welcome, {"user_id": 1, "lang": "x" * 7000})
        await wait_until_async(lambda: relay.published_total == 5, 10, message="all five published")
        assert publisher_of(relay).notified_published == 0
        found = sorted(int(e["id"]) for e in await entries(redis, settings.redis_prefix, "default"))
        found += [int(e["id"]) for e in await entries(redis, settings.redis_prefix, "mail")]
        assert sorted(found) == sorted([*bulk, delayed, large])


async def test_another_schemas_a_malformed_or_an_already_seen_jobs_notification_is_dropped(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    async with running_relay(quiet(settings), **QUIET) as (relay, signals):
        await until_idle(signals)
        [first] = enqueue_sql(conn, 1)
        await wait_until_async(lambda: relay.published_total == 1, 10, message="the first published")
        row = conn.execute(
            "SELECT id, queue, task, args::text, headers::text, priority, attempts,"
            " (extract(epoch FROM created_at) * 1000)::int8 FROM postbox.outbox"
        ).fetchone()
        conn.commit()
        assert row is not None
        again = orjson.dumps(["postbox", *row, False]).decode()
        stranger = orjson.dumps(["elsewhere", row[0] + 1000, *row[1:], False]).decode()
        bad_id = orjson.dumps(["postbox", "1", *row[1:], False]).decode()
        with conn.transaction():
            for payload in (again, stranger, "not json", "[1, 2]", bad_id):
                conn.execute("SELECT pg_notify('postbox_outbox', %s)", (payload,))
        with conn.transaction():  # after them on the listener's connection: selected (two rows, an empty payload)
            barrier = postbox.enqueue_many(conn, [{"task": "noop"}] * 2)
        await wait_until_async(lambda: relay.published_total == 3, 10, message="the two after them published")

        def marked() -> bool:
            count = conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'queued'").fetchone()
            conn.commit()
            return count == (3,)

        await wait_until_async(marked, 10, message="the held marks")
        await until_idle(signals)
        [second] = enqueue_sql(conn, 1)
        await wait_until_async(lambda: relay.published_total == 4, 10, message="the second published")
        # Neither the first again, nor a job of another schema or of a malformed payload: one entry each.
        assert publisher_of(relay).notified_published == 2
        expected = sorted([first, *barrier, second])
        assert sorted(int(e["id"]) for e in await entries(redis, settings.redis_prefix)) == expected


async def test_a_lower_id_committed_late_is_selected_at_once_not_at_the_next_poll(
    settings: Settings, redis: aioredis.Redis, conn: psycopg.Connection[Any]
) -> None:
    """Its payload comes after a higher id went out from its own: dropped, and that turn selects (no poll for 30 s)."""
    async with running_relay(quiet(settings), **QUIET) as (relay, signals):
        await until_idle(signals)
        with psycopg.connect(conn.info.dsn) as late:
            [low] = enqueue_sql(late, 1, commit=False)  # its id first, its commit last
            [high] = enqueue_sql(conn, 1)
            await wait_until_async(lambda: relay.published_total == 1, 10, message="the higher id published")

            def marked() -> bool:
                state = conn.execute("SELECT state FROM postbox.outbox WHERE id = %s", (high,)).fetchone()
                conn.commit()
                return state == ("queued",)

            await wait_until_async(marked, 10, message="its held mark")  # the turn that marks it selects too
            await until_idle(signals)
            assert signals.idle is not None
            signals.idle.clear()
            late.commit()
            await wait_event(signals.idle, 10)  # the turn its notification caused is over...
        # ...and it selected: the job is in the stream (not left to a poll, a sweep or a schedule's look)
        assert sorted(int(e["id"]) for e in await entries(redis, settings.redis_prefix)) == [low, high]
        await wait_until_async(lambda: relay.published_total == 2, 10, message="its held mark")
        assert publisher_of(relay).notified_published == 1
        assert sorted(int(e["id"]) for e in await entries(redis, settings.redis_prefix)) == [low, high]
