"""Fair queues: the relay keeps a fair queue's window and fills it with its keys in turn."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest
import redis.asyncio as aioredis

from postbox import fairness
from postbox.errors import InvalidOptionError
from postbox.relay import RelaySignals
from postbox.relay.fairness import FairQueues
from postbox.relay.notifier import notified_rows
from postbox.relay.publisher import Publisher
from postbox.settings import Settings
from tests.harness.relay import entries, lose_prefix, running_relay
from tests.harness.wait import wait_until_async

QUEUE = "fairq"


def enqueue(conn: psycopg.Connection[Any], n: int, tenant: Any, *, priority: int = 5, delay: float = 0.0) -> list[int]:
    """``n`` noop jobs of ``tenant`` (None: without the argument) through SQL ``postbox.enqueue()``; committed."""
    args = orjson.dumps({} if tenant is None else {"tenant_id": tenant}).decode()
    ids = []
    for _ in range(n):
        row = conn.execute(
            "SELECT postbox.enqueue('noop', %s::jsonb, %s, %s, now() + make_interval(secs => %s))",
            (args, QUEUE, priority, delay),
        ).fetchone()
        assert row is not None
        ids.append(int(row[0]))
    conn.commit()
    return ids


async def published(redis: aioredis.Redis, settings: Settings) -> list[int]:
    """Ids in the fair queue's streams, in stream order (highest priority stream first)."""
    return [int(e["id"]) for e in await entries(redis, settings.redis_prefix, QUEUE)]


def finish(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    """End jobs as a worker would (their outcome recorded): they leave the window."""
    conn.execute("UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() WHERE id = ANY(%s)", (ids,))
    conn.commit()


def keys(conn: psycopg.Connection[Any]) -> dict[int, str | None]:
    conn.commit()
    rows = conn.execute("SELECT id, fair_key FROM postbox.outbox WHERE queue = %s", (QUEUE,)).fetchall()
    conn.commit()
    return {r[0]: r[1] for r in rows}


def fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"fair_poll_interval": 0.02})


async def test_a_fair_queue_keeps_its_window_and_serves_its_keys_in_turn(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    fairness.declare(conn, QUEUE, by="tenant_id", window=10)
    conn.commit()
    a = enqueue(conn, 50, "a")
    b = enqueue(conn, 5, "b")
    async with running_relay(fast(settings)):
        await wait_until_async(lambda: published(redis, settings), 10, message="a first fill")
        first = await published(redis, settings)
        # max-min fair: both keys had nothing in flight, so they alternate: 5 of a, all 5 of b
        assert sorted(first) == sorted(a[:5] + b)
        assert keys(conn) == {**{i: "a" for i in a}, **{i: "b" for i in b}}
        finish(conn, a[:2] + b[:1])  # three places free: b has none waiting, a takes them
        got = await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 13), 10, message="the refill"
        )
        assert sorted(got) == sorted(a[:8] + b)

        def in_flight() -> Any:
            conn.commit()
            return conn.execute(
                "SELECT count(*) FROM postbox.outbox WHERE queue = %s AND state IN ('queued', 'running')", (QUEUE,)
            ).fetchone() == (10,)

        await wait_until_async(in_flight, 10, message="the refill marked")
    assert len(await published(redis, settings)) == 13


async def _when(ids_coro: Any, test: Any) -> Any:
    ids = await ids_coro
    return ids if test(ids) else None


async def test_a_late_key_is_served_before_the_backlog_and_priorities_order_each_key(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    fairness.declare(conn, QUEUE, by="tenant_id", window=4)
    conn.commit()
    async with running_relay(fast(settings)):
        a = enqueue(conn, 200, "a")
        await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 4), 10, message="a's window"
        )
        assert sorted(await published(redis, settings)) == a[:4]
        low = enqueue(conn, 2, 7, priority=1)  # a number is keyed by its JSON text
        high = enqueue(conn, 1, 7, priority=9)
        none = enqueue(conn, 1, None)  # without the argument: the key ''
        await wait_until_async(lambda: None not in keys(conn).values(), 10, message="the new jobs keyed")
        finish(conn, a[:3])  # three places: the two new keys first (nothing in flight), their best job first
        got = await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 4 + 3), 10, message="the refill"
        )
        assert sorted(got) == sorted(a[:4] + high + none + [a[4]])
        finish(conn, high + none)
        got = await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 9), 10, message="the next refill"
        )
        # a still has two in flight, key '7' none: both places go to '7' (its remaining two jobs)
        assert sorted(got) == sorted(a[:4] + high + none + [a[4]] + low)
    assert {k for i, k in keys(conn).items() if i in low + high} == {"7"}
    assert keys(conn)[none[0]] == ""


async def test_a_job_keyed_before_its_notification_is_read_waits_for_the_window(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """A turn's look at the newest rows can key a job whose notification the relay reads only on its next
    turn; that notification's row is then held back with the others (no entry outside the window)."""
    await aconn.set_autocommit(True)
    fairness.declare(conn, QUEUE, by="tenant_id", window=1)
    conn.commit()
    publisher = Publisher(redis, settings.redis_prefix)
    fair = FairQueues(publisher, default_window=10, poll_interval=0.02)
    await fair.refresh(aconn, force=True)
    [first] = enqueue(conn, 1, "a")
    [late] = enqueue(conn, 1, "b")
    await fair.step(aconn)  # keys both (the newest rows), fills the window of one with the first
    assert keys(conn) == {first: "a", late: "b"}
    assert await published(redis, settings) == [first]
    row = conn.execute(
        "SELECT id, queue, task, args::text, headers::text, priority, attempts,"
        " (extract(epoch FROM created_at) * 1000)::int8 FROM postbox.outbox WHERE id = %s",
        (late,),
    ).fetchone()
    conn.commit()
    assert row is not None
    carried = notified_rows([orjson.dumps(["postbox", *row, False]).decode()], "postbox")
    result, dealt_with = await publisher.publish_notified(aconn, carried)
    assert dealt_with is True
    assert result is not None and (result.keyed, result.published) == ([late], [])
    assert await published(redis, settings) == [first]
    finish(conn, [first])
    await fair.step(aconn, notified=False)
    assert await published(redis, settings) == [first, late]


async def test_a_redis_flush_keeps_the_window_counted_in_postgresql(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    """The reconciler publishes the window's jobs again; the window does not grow, nothing else is published."""
    fairness.declare(conn, QUEUE, by="tenant_id", window=6)
    conn.commit()
    a = enqueue(conn, 30, "a")
    signals = RelaySignals.all()
    async with running_relay(fast(settings), signals=signals, epoch_check_interval=0.1):
        await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 6), 10, message="the window"
        )
        assert await lose_prefix(redis, settings.redis_prefix) > 0
        await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 6), 10, message="the republish"
        )
        assert signals.redis_loss is not None and signals.redis_loss.is_set()
        assert sorted(await published(redis, settings)) == a[:6]
    conn.commit()
    counts = conn.execute(
        "SELECT state, count(*), sum(publish_count) FROM postbox.outbox WHERE queue = %s GROUP BY state ORDER BY 1",
        (QUEUE,),
    ).fetchall()
    assert counts == [("pending", 24, 0), ("queued", 6, 12)]


async def test_clearing_fairness_returns_the_waiting_jobs_to_id_order(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    fairness.declare(conn, QUEUE, by="tenant_id", window=2)
    conn.commit()
    a = enqueue(conn, 20, "a")
    async with running_relay(fast(settings)):
        await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 2), 10, message="the window"
        )
        assert fairness.clear(conn, QUEUE) is True
        conn.commit()
        await wait_until_async(
            lambda: _when(published(redis, settings), lambda ids: len(ids) == 20), 10, message="the rest"
        )
    assert set(keys(conn).values()) == {None}
    assert sorted(await published(redis, settings)) == a
    assert fairness.clear(conn, QUEUE) is False


async def test_changing_the_argument_rekeys_the_waiting_jobs(conn: psycopg.Connection[Any]) -> None:
    fairness.declare(conn, QUEUE, by="tenant_id")
    conn.commit()
    conn.execute(
        "INSERT INTO postbox.outbox (queue, task, args, fair_key) VALUES (%s, 'noop', '{\"org\": \"x\"}', '')",
        (QUEUE,),
    )
    fairness.declare(conn, QUEUE, by="org", window=3)
    conn.commit()
    assert set(keys(conn).values()) == {"x"}
    row = conn.execute("SELECT key_arg, window_size FROM postbox.fair_queues").fetchone()
    assert row == ("org", 3)


@pytest.mark.parametrize(
    ("queue", "by", "window", "field"),
    [
        ("Bad Queue", "t", None, "queue"),
        (QUEUE, "", None, "by"),
        (QUEUE, "t", 0, "window"),
        (QUEUE, "t", True, "window"),
    ],
)
def test_a_bad_declaration_is_refused_and_writes_nothing(
    conn: psycopg.Connection[Any], queue: str, by: str, window: Any, field: str
) -> None:
    with pytest.raises(InvalidOptionError) as info:
        fairness.declare(conn, queue, by=by, window=window)
    assert info.value.field == field
    conn.commit()
    assert conn.execute("SELECT count(*) FROM postbox.fair_queues").fetchone() == (0,)


async def test_an_unfair_queue_beside_a_fair_one_is_published_in_id_order_at_once(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    fairness.declare(conn, QUEUE, by="tenant_id", window=1)
    conn.commit()
    enqueue(conn, 10, "a")
    plain = [
        int(conn.execute("SELECT postbox.enqueue('noop', '{}'::jsonb, 'plain')").fetchone()[0])  # type: ignore[index]
        for _ in range(50)
    ]
    conn.commit()
    async with running_relay(fast(settings)):
        await wait_until_async(
            lambda: _when(_ids(redis, settings, "plain"), lambda ids: len(ids) == 50), 10, message="the plain queue"
        )
        await wait_until_async(lambda: published(redis, settings), 10, message="the fair queue's window")
        assert len(await published(redis, settings)) == 1
    assert await _ids(redis, settings, "plain") == plain


async def _ids(redis: aioredis.Redis, settings: Settings, queue: str) -> list[int]:
    return [int(e["id"]) for e in await entries(redis, settings.redis_prefix, queue)]


def test_a_bulk_enqueue_writes_the_keys_with_its_rows(conn: psycopg.Connection[Any]) -> None:
    """enqueue_many's COPY keys a fair queue's jobs itself (no relay running); a plain queue's stay unkeyed."""
    from postbox import enqueue_many
    from tests.harness.tasks import fair as f

    fairness.declare(conn, f.QUEUE, by="tenant_id")
    conn.commit()
    ids = enqueue_many(conn, [{"task": "fair_job", "args": {"tenant_id": t}} for t in ("x", "y", "x")])
    plain = enqueue_many(conn, [{"task": "fair_job", "args": {"tenant_id": "x"}, "queue": "plainq"}])
    conn.commit()
    rows = dict(conn.execute("SELECT id, fair_key FROM postbox.outbox").fetchall())
    assert [rows[i] for i in ids] == ["x", "y", "x"]
    assert rows[plain[0]] is None


def test_a_producer_rereads_the_declarations_after_two_seconds(conn: psycopg.Connection[Any]) -> None:
    now = [1000.0]
    fairness.declare(conn, QUEUE, by="tenant_id")  # this process's copy is dropped
    conn.commit()
    assert fairness.declared(conn, clock=lambda: now[0]) == {QUEUE: "tenant_id"}
    conn.execute("UPDATE postbox.fair_queues SET key_arg = 'org'")  # another process's change
    conn.commit()
    now[0] += 1.9
    assert fairness.declared(conn, clock=lambda: now[0]) == {QUEUE: "tenant_id"}  # the copy, still fresh
    now[0] += 0.2
    assert fairness.declared(conn, clock=lambda: now[0]) == {QUEUE: "org"}
