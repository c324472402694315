"""The relay's held-back marks (``POSTBOX_RELAY_MARK_DELAY``) on real PostgreSQL and Redis, in-process.

The publisher runs on a clock the test moves, so "before the delay" and "after it" are exact.
"""

from __future__ import annotations

from typing import Any

import psycopg
import redis.asyncio as aioredis

from postbox.app.services import moves
from postbox.app.services.audit import Actor
from postbox.relay.publisher import BatchResult, Publisher
from postbox.settings import Settings
from tests.harness.relay import enqueue_sql, entries, lose_prefix, running_relay
from tests.harness.wait import next_item, wait_event, wait_until_async

DELAY = 0.25  # (binary fractions: the clock arithmetic is exact)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    conn.commit()
    found = conn.execute(
        "SELECT id, state, publish_count, stream_id, published_at IS NOT NULL FROM postbox.outbox ORDER BY id"
    ).fetchall()
    conn.commit()
    return found


def held_publisher(
    redis: aioredis.Redis, settings: Settings, clock: Clock, **kw: Any
) -> tuple[Publisher, list[list[int]]]:
    """A publisher holding marks for :data:`DELAY` on ``clock``, and the ids of each mark it sends."""
    marks: list[list[int]] = []

    async def before_mark(ids: list[int]) -> None:
        marks.append(list(ids))

    publisher = Publisher(
        redis, settings.redis_prefix, mark_delay=DELAY, monotonic=clock, before_mark=before_mark, **kw
    )
    return publisher, marks


async def test_part_batches_are_marked_together_once_the_delay_is_up_and_never_sent_twice(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await aconn.set_autocommit(True)
    clock = Clock()
    publisher, marks = held_publisher(redis, settings, clock)
    seen: list[BatchResult] = []
    [first] = enqueue_sql(conn)
    await publisher.publish_burst(aconn, on_batch=seen.append, hold=True)
    assert publisher.marks_due_in() == DELAY
    # Sent, not marked: the row is still unpublished in PostgreSQL ...
    assert rows(conn) == [(first, "pending", 0, None, False)]
    [second] = enqueue_sql(conn)
    clock.now += DELAY / 2
    await publisher.publish_burst(aconn, on_batch=seen.append, hold=True)
    # ... and yet the next select leaves it out: one entry per job.
    found = await entries(redis, settings.redis_prefix)
    assert sorted(int(e["id"]) for e in found) == [first, second]
    await publisher.flush_marks(aconn, due_only=True)  # not due yet
    assert (marks, seen) == ([], [])
    assert publisher.marks_due_in() == DELAY / 2
    clock.now += DELAY / 2
    await publisher.flush_marks(aconn, due_only=True)
    assert marks == [[first, second]]  # one mark for both
    assert [r.published for r in seen] == [[first], [second]]
    assert [r.marked for r in seen] == [0, 2]
    sid = {int(e["id"]): e["_sid"] for e in found}
    assert rows(conn) == [(first, "queued", 1, sid[first], True), (second, "queued", 1, sid[second], True)]
    assert publisher.marks_due_in() is None
    assert await publisher.publish_burst(aconn, hold=True) == [BatchResult()]  # nothing left to send


async def one_job_held(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> tuple[Publisher, list[list[int]], Clock, int, list[BatchResult], dict[str, Any]]:
    """One job sent with its mark held: the publisher, its marks, its clock, the job, the batches seen, the entry."""
    await aconn.set_autocommit(True)
    clock = Clock()
    publisher, marks = held_publisher(redis, settings, clock)
    [job] = enqueue_sql(conn)
    seen: list[BatchResult] = []
    await publisher.publish_burst(aconn, on_batch=seen.append, hold=True)
    [entry] = await entries(redis, settings.redis_prefix)
    return publisher, marks, clock, job, seen, entry


async def test_a_held_row_a_worker_claimed_first_is_left_to_the_claim(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    publisher, marks, clock, job, seen, entry = await one_job_held(settings, conn, redis, aconn)
    conn.execute(
        """UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = 'w', published_at = now(),
                  stream_id = %s, lease_until = now() + interval '30 s'""",
        (entry["_sid"],),
    )
    conn.commit()
    clock.now += DELAY
    await publisher.flush_marks(aconn, due_only=True)
    assert marks == [[job]]
    assert [(r.published, r.marked) for r in seen] == [([job], 0)]
    assert rows(conn) == [(job, "running", 0, entry["_sid"], True)]


async def test_a_held_row_moved_to_a_later_time_is_left_unpublished_and_sent_again_when_due(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """The move sees the row unpublished (its mark is held); the mark must not take it for sent (migration 0019)."""
    publisher, marks, clock, job, seen, stale = await one_job_held(settings, conn, redis, aconn)
    moved = await moves.move_jobs(aconn, Actor("test"), ids=[job], delay=0.5)
    assert [(m.id, m.was_published) for m in moved.moved] == [(job, False)]
    clock.now += DELAY
    await publisher.flush_marks(aconn, due_only=True)
    assert marks == [[job]]
    assert [(r.published, r.marked) for r in seen] == [([job], 0)]
    assert rows(conn) == [(job, "pending", 0, None, False)]  # not queued behind an entry the claim skips

    async def sent_again() -> bool:
        await publisher.publish_burst(aconn)  # unheld: marked at once
        return len(await entries(redis, settings.redis_prefix)) == 2

    await wait_until_async(sent_again, 10, message="the job sent again once due")
    fresh = [e for e in await entries(redis, settings.redis_prefix) if e["_sid"] != stale["_sid"]]
    assert [int(e["id"]) for e in fresh] == [job]
    assert rows(conn) == [(job, "queued", 1, fresh[0]["_sid"], True)]


async def test_held_ids_reaching_a_batch_are_marked_at_once(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await aconn.set_autocommit(True)
    clock = Clock()
    publisher, marks = held_publisher(redis, settings, clock, batch_size=3)
    first = enqueue_sql(conn, 2)
    await publisher.publish_burst(aconn, hold=True)
    assert marks == []
    [third] = enqueue_sql(conn)
    await publisher.publish_burst(aconn, hold=True)  # 2 held + 1: a full batch's worth, marked with no wait
    assert marks == [[*first, third]]
    assert [r[1] for r in rows(conn)] == ["queued"] * 3
    assert publisher.marks_due_in() is None


async def test_without_a_delay_every_batch_is_marked_at_once(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await aconn.set_autocommit(True)
    publisher = Publisher(redis, settings.redis_prefix, mark_delay=0.0)
    [job] = enqueue_sql(conn)
    await publisher.publish_burst(aconn, hold=True)
    assert publisher.marks_due_in() is None
    assert [r[:3] for r in rows(conn)] == [(job, "queued", 1)]


async def test_a_forgotten_hold_is_sent_again_not_marked(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """After Redis lost data the held entries may be gone: the rows go out again (the reconciler's call)."""
    await aconn.set_autocommit(True)
    clock = Clock()
    publisher, marks = held_publisher(redis, settings, clock)
    [job] = enqueue_sql(conn)
    await publisher.publish_burst(aconn, hold=True)
    assert await lose_prefix(redis, settings.redis_prefix) > 0
    publisher.forget_groups()
    publisher.forget_held()
    await publisher.publish_burst(aconn, hold=True)
    assert [int(e["id"]) for e in await entries(redis, settings.redis_prefix)] == [job]
    clock.now += DELAY
    await publisher.flush_marks(aconn, due_only=True)
    assert marks == [[job]]
    assert [r[:3] for r in rows(conn)] == [(job, "queued", 1)]


async def test_the_relay_marks_what_it_holds_when_it_stops(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    """A stopping relay leaves nothing to be sent again: its held marks go out before it lets go."""
    slow = settings.model_copy(update={"relay_mark_delay": 1.0})
    async with running_relay(slow) as (relay, signals):
        await wait_event(signals.leader, 10)
        [job] = enqueue_sql(conn)
        assert signals.published is not None
        await wait_until_async(lambda: entry_count(redis, settings), 10, message="the job's entry")
        assert [r[:3] for r in rows(conn)] == [(job, "pending", 0)]  # held (for up to a second)
        relay.stop()
        assert await next_item(signals.published, 10) == [job]
    assert [r[:3] for r in rows(conn)] == [(job, "queued", 1)]


async def entry_count(redis: aioredis.Redis, settings: Settings) -> int:
    return len(await entries(redis, settings.redis_prefix))


async def test_a_held_row_claimed_and_back_for_a_retry_is_not_marked_but_sent_for_its_next_attempt(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """The mark names the attempt it sent: a row claimed, run and retrying meanwhile is unpublished again."""
    await aconn.set_autocommit(True)
    clock = Clock()
    publisher, marks = held_publisher(redis, settings, clock)
    [job] = enqueue_sql(conn)
    await publisher.publish_burst(aconn, hold=True)
    conn.execute(  # a worker took the entry, ran attempt 1, and recorded a retry due now
        """UPDATE postbox.outbox SET state = 'retrying', attempts = 1, published_at = NULL, publish_count = 1,
                  available_at = now(), started_at = now()"""
    )
    conn.commit()
    clock.now += DELAY
    await publisher.flush_marks(aconn, due_only=True)
    assert marks == [[job]]
    assert [r[:3] for r in rows(conn)] == [(job, "retrying", 1)]  # not taken for sent
    await publisher.publish_burst(aconn, hold=True)  # so the next pass sends attempt 2
    assert [(int(e["id"]), e["attempt"]) for e in await entries(redis, settings.redis_prefix)] == [(job, 1), (job, 2)]
    clock.now += DELAY
    await publisher.flush_marks(aconn, due_only=True)
    assert [r[:3] for r in rows(conn)] == [(job, "queued", 2)]
