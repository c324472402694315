"""The relay's publish loop on real PostgreSQL and Redis, in-process."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, LiteralString

import psycopg
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from postbox import redis_conn, sql
from postbox.relay import publisher as publisher_module
from postbox.relay.publisher import Publisher, cursor_after
from postbox.relay.service import run_until_published
from postbox.settings import Settings
from postbox.streams import GROUP, decode_entry, parse_wake, ready_key, stream_key, wake_key
from tests.harness.relay import enqueue_sql, entries, entry_ids, running_relay, states
from tests.harness.wait import next_item, wait_event, wait_until, wait_until_async


async def test_publishes_committed_rows_to_their_stream_and_marks_them(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    async with running_relay(settings) as (_relay, signals):
        await wait_event(signals.leader, 10)
        ids = enqueue_sql(conn, 3, queue="mail", priority=7)
        got: list[int] = []
        while len(got) < 3:
            assert signals.published is not None
            got += await next_item(signals.published, 5)
    assert sorted(got) == ids
    found = await entries(redis, settings.redis_prefix, "mail")
    assert sorted(int(e["id"]) for e in found) == ids
    assert {e["_key"] for e in found} == {stream_key(settings.redis_prefix, "mail", 7)}
    assert {e["task"] for e in found} == {"noop"}
    assert {e["attempt"] for e in found} == {1}
    by_id = {int(e["id"]): e["_sid"] for e in found}
    conn.commit()
    rows = conn.execute(
        "SELECT id, state, publish_count, stream_id, published_at IS NOT NULL FROM postbox.outbox ORDER BY id"
    ).fetchall()
    assert rows == [(i, "queued", 1, by_id[i], True) for i in ids]
    groups = await redis.xinfo_groups(stream_key(settings.redis_prefix, "mail", 7))
    assert [g["name"] for g in groups] == [GROUP.encode()]
    # and the stream went into the ready set the workers' reads look at (postbox.worker.consumer)
    assert await redis.smembers(ready_key(settings.redis_prefix)) == {
        stream_key(settings.redis_prefix, "mail", 7).encode()
    }


async def test_backlog_is_published_in_batches_in_id_order(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    ids = enqueue_sql(conn, 25)
    batches: list[list[int]] = []
    async with running_relay(settings.model_copy(update={"relay_batch_size": 10})) as (_relay, signals):
        assert signals.published is not None
        while sum(len(b) for b in batches) < 25:
            batches.append(await next_item(signals.published, 5))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [i for b in batches for i in b] == ids
    found = await entries(redis, settings.redis_prefix)
    assert [int(e["id"]) for e in found] == ids  # XADD order = id order
    assert set(states(conn).values()) == {("queued", 1)}


async def test_a_backlog_goes_out_highest_priority_first_then_in_id_order(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    """Strict priority from the outbox on: jobs of priority 9 committed behind a backlog of priority 0 and 5
    are published in the relay's first batch, not after everything older."""
    low = enqueue_sql(conn, 12, priority=0)
    middle = enqueue_sql(conn, 6, priority=5, commit=False) + enqueue_sql(conn, 2, priority=0)  # one commit
    high = enqueue_sql(conn, 5, priority=9)
    batches: list[list[int]] = []
    async with running_relay(settings.model_copy(update={"relay_batch_size": 10})) as (_relay, signals):
        assert signals.published is not None
        while sum(len(b) for b in batches) < 25:
            batches.append(await next_item(signals.published, 5))
    assert batches == [high + middle[:5], [middle[5], *low[:9]], [*low[9:], *middle[6:]]]
    found = await entries(redis, settings.redis_prefix)  # highest priority's stream first, each in XADD order
    assert [int(e["id"]) for e in found] == high + middle[:6] + low + middle[6:]
    assert set(states(conn).values()) == {("queued", 1)}


async def test_a_burst_skips_only_the_batch_in_flight_and_the_next_burst_takes_what_came_above_it(
    settings: Settings,
    conn: psycopg.Connection[Any],
    database_url: str,
    redis: aioredis.Redis,
    aconn: psycopg.AsyncConnection[Any],
) -> None:
    """The burst's cursor is the last row's (priority, id): a job of a higher priority committed while the
    burst runs, and one of the same priority with a lower id (a late commit), are published by the next
    burst, not lost behind the cursor."""
    await aconn.set_autocommit(True)
    publisher = Publisher(redis, settings.redis_prefix, batch_size=10)
    with psycopg.connect(database_url) as tx_a:
        row = tx_a.execute("SELECT postbox.enqueue('noop', '{}'::jsonb, 'default', 5)").fetchone()
        assert row is not None
        late = row[0]  # a lower id than every row below, committed after the first burst
        ids = enqueue_sql(conn, 15, priority=5)
        first = await publisher.select_due(aconn)
        assert [r[0] for r in first] == ids[:10]
        assert cursor_after(first) == (5, ids[9])
        urgent = enqueue_sql(conn, 1, priority=8)
        following = await publisher.select_due(aconn, after=cursor_after(first))
        assert [r[0] for r in following] == ids[10:]  # the cursor is past priority 8: left for the next burst
        results = await publisher.publish_burst(aconn)
        assert [r.published for r in results] == [urgent + ids[:9], ids[9:]]
        tx_a.commit()
    again = await publisher.publish_burst(aconn)
    assert [r.published for r in again] == [[late]]
    assert states(conn) == {i: ("queued", 1) for i in [late, *urgent, *ids]}


async def test_a_row_a_select_returned_is_not_sent_again_from_its_notification(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """A select's rows are no longer in id order: the highest id it returned, not its last row's, bounds
    what a notification may still send (publish_notified), or a job would be published twice."""
    await aconn.set_autocommit(True)
    low = enqueue_sql(conn, 2, priority=0)
    high = enqueue_sql(conn, 1, priority=9)
    publisher = Publisher(redis, settings.redis_prefix, batch_size=10)
    rows = await publisher.select_due(aconn)
    assert [r[0] for r in rows] == high + low  # the highest id first
    assert await publisher.publish_notified(aconn, [rows[0]]) == (None, False)  # left to the select
    assert publisher.notified_published == 0 and await entry_ids(redis, settings.redis_prefix) == []


async def test_notify_wakes_the_relay_long_before_the_poll(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    slow_poll = settings.model_copy(update={"poll_interval": 30.0})
    async with running_relay(slow_poll, heartbeat_interval=30.0, epoch_check_interval=30.0) as (_relay, signals):
        await wait_event(signals.listening, 10)
        assert signals.published is not None
        await asyncio.sleep(0)  # let the first idle wait begin
        while not signals.published.empty():
            signals.published.get_nowait()
        start = time.monotonic()
        ids = enqueue_sql(conn, 1)
        assert await next_item(signals.published, 5) == ids
        assert time.monotonic() - start < 1.0


async def test_expired_rows_are_not_published(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    [stale] = enqueue_sql(conn, 1)
    conn.execute("UPDATE postbox.outbox SET expires_at = now() - interval '1 second' WHERE id = %s", (stale,))
    conn.commit()
    [fresh] = enqueue_sql(conn, 1)
    async with running_relay(settings) as (_relay, signals):
        assert signals.published is not None
        assert await next_item(signals.published, 5) == [fresh]
    assert await entry_ids(redis, settings.redis_prefix) == [fresh]
    assert states(conn) == {stale: ("expired", 0), fresh: ("queued", 1)}


async def test_a_row_claimed_before_the_mark_is_left_alone(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """The mark only touches rows still unpublished: a worker's claim (between XADD and mark) wins."""
    [job] = enqueue_sql(conn, 1)
    await aconn.set_autocommit(True)
    publisher = Publisher(redis, settings.redis_prefix)
    cur = await aconn.execute(
        sql.active().JOB_GET_DUE_UNPUBLISHED, {"after_priority": 10, "after_id": 0, "limit": 10, "held": "{}"}
    )
    ids, sids, refused = await publisher.xadd_rows(await cur.fetchall())
    assert (ids, refused) == ([job], [])
    conn.execute(
        """UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = 'w', published_at = now(),
                             lease_until = now() + interval '30 s'"""
    )
    conn.commit()
    params = {"ids": ids, "sids": sids, "term": None, "attempts": [0]}
    cur = await aconn.execute(sql.active().JOB_MARK_PUBLISHED, params)
    assert await cur.fetchone() == (True, 0, None)  # leads, rows marked, seconds to the next delayed row
    assert states(conn) == {job: ("running", 0)}


@pytest.mark.parametrize(
    ("statement", "state", "expected"),
    [
        (sql.active().JOB_MARK_PUBLISHED, "pending", [(True, 20, None)]),
        (sql.active().JOB_MARK_REPUBLISHED, "queued", [(True, 20)]),
        (sql.active().JOB_MARK_EXPIRED, "pending", 20),
        (sql.active().JOB_RENEW_LEASES, "running", "every id"),
    ],
)
def test_a_mark_locks_its_rows_in_id_order_with_statistics_from_before_a_truncate(
    conn: psycopg.Connection[Any], database_url: str, statement: LiteralString, state: str, expected: Any
) -> None:
    """A worker's claim locks rows in id order; the relay's marks must too, whatever their plan.

    Statistics taken with a full backlog, then TRUNCATE: the planner hashes the batch and
    probes the heap, which visits rows in physical order. Here the batch's rows lie in the
    heap highest id first. While the mark waits for the lowest id (held by a "claim"), it
    must hold none of the others, or that claim's next lock is a deadlock.
    """
    conn.execute(
        """INSERT INTO postbox.outbox (queue, task, state, published_at, claimed_by, expires_at)
           SELECT 'default', 'noop', %(state)s, CASE WHEN %(state)s <> 'pending' THEN now() END,
                  CASE WHEN %(state)s = 'running' THEN 'w1' END, now() - interval '1 hour'
             FROM generate_series(1, 20000)""",
        {"state": state},
    )
    conn.execute("ANALYZE postbox.outbox")
    conn.execute("TRUNCATE postbox.outbox, postbox.job_attempts, postbox.processed_jobs")
    conn.execute(
        """INSERT INTO postbox.outbox (queue, task, state, published_at, finished_at)
           SELECT 'default', 'noop', 'succeeded', now(), now() FROM generate_series(1, 2000)"""
    )
    row = conn.execute("SELECT max(id) FROM postbox.outbox").fetchone()
    assert row is not None
    ids = list(range(row[0] + 20, row[0], -1))
    for job_id in ids:  # highest id first in the heap
        conn.execute(
            """INSERT INTO postbox.outbox (id, queue, task, state, published_at, claimed_by, expires_at)
               OVERRIDING SYSTEM VALUE
               VALUES (%(id)s, 'default', 'noop', %(state)s, CASE WHEN %(state)s <> 'pending' THEN now() END,
                       CASE WHEN %(state)s = 'running' THEN 'w1' END, now() - interval '1 hour')""",
            {"id": job_id, "state": state},
        )
    conn.commit()
    ids.sort()
    found: list[Any] = []
    with psycopg.connect(database_url) as claim, psycopg.connect(database_url, autocommit=True) as relay_conn:
        claim.execute("SELECT 1 FROM postbox.outbox WHERE id = %s FOR UPDATE", (ids[0],))
        params = {
            "ids": ids,
            "sids": [f"1-{i}" for i in ids],
            "term": None,
            "attempts": [0] * len(ids),
            "worker": "w1",
            "lease": 30,
        }

        def mark() -> None:
            cur = relay_conn.execute(statement, params)
            found.append(sorted(cur.fetchall()) if cur.description else cur.rowcount)

        marking = threading.Thread(target=mark)
        marking.start()
        try:
            pid = relay_conn.info.backend_pid
            query = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"

            def mark_waits() -> bool:
                waits = conn.execute(query, (pid,)).fetchone()
                conn.commit()
                return bool(waits and waits[0])

            wait_until(mark_waits, 10, message="the mark waiting for the claimed row")
            # the claim's next row: free, not held by the waiting mark (NOWAIT: no deadlock wait)
            claim.execute("SELECT 1 FROM postbox.outbox WHERE id = %s FOR UPDATE NOWAIT", (ids[-1],))
        finally:
            claim.rollback()
            marking.join(10)
    if expected == "every id":
        expected = [(i,) for i in ids]
    assert found == [expected]
    if statement is sql.active().JOB_MARK_EXPIRED:
        assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'expired'").fetchone() == (20,)
    if statement is sql.active().JOB_RENEW_LEASES:
        renewed = "SELECT count(*) FROM postbox.outbox WHERE lease_until > now() + interval '20 s'"
        assert conn.execute(renewed).fetchone() == (20,)


async def test_twenty_relays_ensuring_the_same_groups_at_once_all_succeed(
    settings: Settings, redis: aioredis.Redis
) -> None:
    keys = [stream_key(settings.redis_prefix, "race", p) for p in (5, 7)]
    clients = [aioredis.Redis.from_url(str(settings.redis_url)) for _ in range(20)]
    publishers = [Publisher(c, settings.redis_prefix) for c in clients]
    try:
        results = await asyncio.gather(*(p.ensure_groups(keys) for p in publishers), return_exceptions=True)
    finally:
        for c in clients:
            await c.aclose()
    assert results == [None] * 20
    assert all(p.known_groups == set(keys) for p in publishers)
    for key in keys:
        groups = await redis.xinfo_groups(key)
        assert [g["name"] for g in groups] == [GROUP.encode()]


async def test_a_group_refused_is_raised_and_not_taken_as_known(settings: Settings, redis: aioredis.Redis) -> None:
    good, bad = (stream_key(settings.redis_prefix, "refuse", p) for p in (1, 2))
    await redis.set(bad, "not a stream")
    publisher = Publisher(redis, settings.redis_prefix)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await publisher.ensure_groups([good, bad])
    assert publisher.known_groups == {good}
    assert [g["name"] for g in await redis.xinfo_groups(good)] == [GROUP.encode()]


async def test_batches_over_more_streams_than_the_publisher_keeps_names_of_go_to_their_own_streams(
    settings: Settings, redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher keeps stream names between batches, up to a bound (here 3): batches of five streams
    each, past it, still land each row in its (queue, priority) stream, name every stream in the ready
    set and the wake-up entry, and create each stream's group."""
    monkeypatch.setattr(publisher_module, "STREAM_NAMES_KEPT", 3)
    prefix = settings.redis_prefix
    publisher = Publisher(redis, prefix)
    batches = [
        [(1, "kept-a", 9), (2, "kept-b", 0), (3, "kept-a", 9), (4, "kept-c", 5), (5, "kept-d", 5), (6, "kept-e", 1)],
        [(7, "kept-e", 1), (8, "kept-f", 2), (9, "kept-a", 9), (10, "kept-g", 3), (11, "kept-h", 4)],
    ]
    for batch in batches:
        rows = [(job_id, queue, "t", "{}", "{}", priority, 0, 0) for job_id, queue, priority in batch]
        ids, _sids, refused = await publisher.xadd_rows(rows)
        assert (ids, refused) == ([job_id for job_id, _q, _p in batch], [])
        assert len(publisher._names) <= 3 + len({(q, p) for _i, q, p in batch})
    expected: dict[str, list[int]] = {}
    for batch in batches:
        for job_id, queue, priority in batch:
            expected.setdefault(stream_key(prefix, queue, priority), []).append(job_id)
    for key, job_ids in expected.items():
        got = [decode_entry(fields)["id"] for _sid, fields in await redis.xrange(key)]
        assert got == job_ids, key
        assert [g["name"] for g in await redis.xinfo_groups(key)] == [GROUP.encode()]
    assert {m.decode() for m in await redis.smembers(ready_key(prefix))} == set(expected)
    named: set[str] = set()
    for _sid, fields in await redis.xrange(wake_key(prefix)):
        named |= parse_wake(prefix, [part for pair in fields.items() for part in pair])
    assert named == set(expected)


async def test_create_groups_answers_per_stream_made_already_there_or_refused(
    settings: Settings, redis: aioredis.Redis
) -> None:
    made, there, refused = (stream_key(settings.redis_prefix, "groups", p) for p in (1, 2, 3))
    await redis.xgroup_create(there, GROUP, id="0", mkstream=True)
    await redis.xadd(there, {"m": "x"})
    await redis.xreadgroup(GROUP, "c", {there: ">"})  # one entry pending in the group there
    await redis.set(refused, "not a stream")
    answers = await redis_conn.create_groups(redis, [made, there, refused], GROUP)
    assert answers[:2] == [None, None]
    assert isinstance(answers[2], ResponseError) and "WRONGTYPE" in str(answers[2])
    assert [g["name"] for g in await redis.xinfo_groups(made)] == [GROUP.encode()]
    assert (await redis.xpending(there, GROUP))["pending"] == 1  # the group there was left as it was
    assert await redis.get(refused) == b"not a stream"


async def test_the_relay_never_trims_streams(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    """No MAXLEN on XADD: 150 entries published in batches of 50 are all still there."""
    ids = enqueue_sql(conn, 150)
    tight = settings.model_copy(update={"relay_batch_size": 50})
    async with running_relay(tight) as (relay, _signals):
        await wait_until_async(lambda: relay.published_total >= 150, 10, message="150 published")
    key = stream_key(settings.redis_prefix, "default", 5)
    assert await redis.xlen(key) == 150
    assert await entry_ids(redis, settings.redis_prefix) == ids


async def test_a_burst_marks_one_batch_while_sending_the_next_and_never_skips_a_late_commit(
    settings: Settings,
    conn: psycopg.Connection[Any],
    database_url: str,
    redis: aioredis.Redis,
    aconn: psycopg.AsyncConnection[Any],
) -> None:
    await aconn.set_autocommit(True)
    publisher = Publisher(redis, settings.redis_prefix, batch_size=10)
    with psycopg.connect(database_url) as tx_a:
        row = tx_a.execute("SELECT postbox.enqueue('noop', '{}'::jsonb)").fetchone()
        assert row is not None
        late = row[0]
        ids = enqueue_sql(conn, 25)
        results = await publisher.publish_burst(aconn)
        assert [r.published for r in results] == [ids[0:10], ids[10:20], ids[20:25]]
        assert [r.marked for r in results] == [10, 10, 5]
        tx_a.commit()
    again = await publisher.publish_burst(aconn)
    assert [r.published for r in again] == [[late]]
    assert await entry_ids(redis, settings.redis_prefix) == sorted([late, *ids])
    assert states(conn) == {i: ("queued", 1) for i in [late, *ids]}


async def test_stale_planner_statistics_are_refreshed_when_a_full_batch_waits(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """A bulk load into a never-analyzed outbox: the planner thinks ~1 row waits; the relay ANALYZEs once."""
    await aconn.set_autocommit(True)
    conn.execute("INSERT INTO postbox.outbox (queue, task) SELECT 'default', 'noop' FROM generate_series(1, 500)")
    conn.commit()
    publisher = Publisher(redis, settings.redis_prefix, batch_size=100)
    assert await publisher.check_statistics(aconn) is True  # estimate < 100: analyzed
    assert await publisher.check_statistics(aconn) is False  # not again within the interval
    publisher._statistics_checked = -1e9
    assert await publisher.check_statistics(aconn) is False  # the estimate is right now
    conn.commit()
    row = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'outbox'").fetchone()
    assert row is not None and row[0] == 500


async def test_run_until_published_runs_a_relay_in_process_until_n_rows_are_out(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    ids = enqueue_sql(conn, 30)
    seen: list[int] = []
    relay = await run_until_published(
        settings.model_copy(update={"relay_batch_size": 8}), 30, max_seconds=10, on_batch=seen.extend
    )
    assert relay.published_total == 30 and relay.role == "stopped"
    assert seen == ids
    assert await entry_ids(redis, settings.redis_prefix) == ids


async def test_next_due_is_answered_once_by_the_bursts_mark_and_never_by_an_older_burst(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await aconn.set_autocommit(True)
    ticks = [1000.0]  # the publisher's monotonic clock, moved by hand
    publisher = Publisher(redis, settings.redis_prefix, batch_size=10, monotonic=lambda: ticks[0])
    enqueue_sql(conn, 1, delay=60)
    [first] = enqueue_sql(conn, 1)
    [result] = await publisher.publish_burst(aconn)
    assert result.published == [first]
    ticks[0] += 20
    from_mark = await publisher.next_due(aconn)  # the mark's answer, as an instant on the relay's clock
    assert from_mark is not None and 39 < from_mark <= 40
    from_query = await publisher.next_due(aconn)  # used once: now the database is asked
    assert from_query is not None and 55 < from_query <= 60

    [second] = enqueue_sql(conn, 1)
    [result] = await publisher.publish_burst(aconn)  # its mark sees the row due in a minute
    assert result.published == [second]
    enqueue_sql(conn, 1, delay=5)  # committed after that mark
    [result] = await publisher.publish_burst(aconn)  # nothing due, nothing marked
    assert (result.selected, result.published) == (0, [])
    soon = await publisher.next_due(aconn)
    assert soon is not None and 0 < soon <= 5
