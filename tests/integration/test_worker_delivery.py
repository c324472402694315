"""Delivery rules on real servers: priority, duplicates, the fence, lost entries, control."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

import postbox
from postbox.errors import AlreadyProcessed
from postbox.outcomes import Outcome
from postbox.settings import Settings
from postbox.streams import GROUP, stream_key
from postbox.worker import claims
from postbox.worker.completer import record_outcomes
from postbox.worker.consumer import Consumer, ensure_groups
from postbox.worker.context import StaleAttempt, WorkerJobContext
from postbox.worker.delivery import Job
from tests.harness.publish import publish_due, xadd_again
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue, fetch, fetchval, finished, job_state, running_worker, worker_settings


async def test_strict_priority_with_a_backlog_in_several_priorities(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    priorities = [p for p in (0, 2, 5, 7, 9) for _ in range(6)]
    random.Random(7).shuffle(priorities)
    items = [{"task": "w_record", "args": {"label": str(p)}, "priority": p} for p in priorities]
    await postbox.enqueue_many_async(aconn, items)
    await aconn.commit()
    await publish_due(aconn, redis, wsettings.redis_prefix)
    t.STARTED.clear()
    async with running_worker(worker_settings(wsettings, concurrency=3)) as worker:
        await finished(worker, len(items))
    started = [int(label) for _, label in t.STARTED]
    assert started == sorted(priorities, reverse=True)


async def test_same_job_published_twice_to_two_workers_at_once_runs_once(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_slow_effect, {"seconds": 0.3})
    one = worker_settings(wsettings, concurrency=1)
    async with running_worker(one) as a, running_worker(one) as b:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        await xadd_again(aconn, redis, wsettings.redis_prefix, [job_id])  # relay crashed before its mark
        await wait_until_async(
            lambda: a.signals.skipped.qsize() + b.signals.skipped.qsize() == 1, 10, message="one skip"
        )  # type: ignore[union-attr]
        done = await finished(a if a.signals.claimed.qsize() else b, 1)  # type: ignore[union-attr]
        assert a.signals.started.qsize() + b.signals.started.qsize() == 1  # type: ignore[union-attr]
    assert done == [(job_id, "succeeded")]
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 1
    assert await fetch(aconn, "SELECT state, attempts FROM postbox.outbox") == [("succeeded", 1)]
    stream = stream_key(wsettings.redis_prefix, t.QUEUE, 5)
    assert await redis.xlen(stream) == 0


async def test_ctx_transaction_counter_1000_jobs_each_delivered_twice(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    aconn = effects
    ids = await postbox.enqueue_many_async(aconn, [{"task": "w_count"} for _ in range(1000)])
    await aconn.commit()
    await publish_due(aconn, redis, wsettings.redis_prefix)
    await xadd_again(aconn, redis, wsettings.redis_prefix, ids)
    many = worker_settings(wsettings, concurrency=10)
    async with running_worker(many), running_worker(many):
        await wait_until_async(
            lambda: fetchval(aconn, "SELECT count(*) = 1000 FROM postbox.outbox WHERE state = 'succeeded'"),
            60,
            message="all done",
        )
        stream = stream_key(wsettings.redis_prefix, t.QUEUE, 5)
        await wait_until_async(lambda: _xlen_is(redis, stream, 0), 10, message="every entry acknowledged and deleted")
    assert await fetchval(aconn, "SELECT value FROM worker_counter") == 1000
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == 1000
    assert await fetchval(aconn, "SELECT max(attempts) FROM postbox.outbox") == 1


async def _xlen_is(redis: aioredis.Redis, stream: str, n: int) -> bool:
    return int(await redis.xlen(stream)) == n


async def test_stale_attempts_outcome_is_rejected_by_the_fence(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_noop)
    await ensure_groups(redis, [stream_key(wsettings.redis_prefix, t.QUEUE, 5)])
    await publish_due(aconn, redis, wsettings.redis_prefix)
    reader = Consumer(redis, consumer="worker-aaaaaaaa")
    deliveries, _, _ = await reader.read([stream_key(wsettings.redis_prefix, t.QUEUE, 5)], 1)
    async with AsyncConnectionPool(database_url, min_size=1, kwargs={"autocommit": True}) as pool:
        first = await claims.claim(pool, deliveries, worker_id="worker-aaaaaaaa", lease=30)
        [stale] = first.run
        # Worker A ran it alone (it wrote the attempt's row at the start: a crash now is
        # charged to the job), stalls; its lease runs out and worker B takes the job over.
        await aconn.execute(
            "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id) VALUES (%s, 1, 'worker-aaaaaaaa')",
            (job_id,),
        )
        await aconn.execute("UPDATE postbox.outbox SET lease_until = now() - interval '1 second'")
        await aconn.commit()
        deliveries[0].reclaimed = True
        second = await claims.claim(pool, deliveries, worker_id="worker-bbbbbbbb", lease=30)
        [current] = second.run
        assert (stale.attempt, current.attempt) == (1, 2)

        async with pool.connection() as conn:
            refused = await record_outcomes(
                conn, "worker-aaaaaaaa", [(stale, Outcome("succeeded", "succeeded"))], lambda j: 60
            )
        assert refused == set()
        assert await fetch(aconn, "SELECT state, attempts, claimed_by FROM postbox.outbox") == [
            ("running", 2, "worker-bbbbbbbb")
        ]

        # Through ctx.transaction(): the stale run's effects roll back with its refused outcome.
        ctx = WorkerJobContext(
            stale,
            worker_id="worker-aaaaaaaa",
            pool=pool,
            registry=postbox.default_registry,
            deadline=None,
        )
        with pytest.raises(StaleAttempt):
            async with ctx.transaction() as conn:
                await conn.execute("UPDATE worker_counter SET value = value + 1")
        assert await fetchval(aconn, "SELECT value FROM worker_counter") == 0
        assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == 0

        async with pool.connection() as conn:
            accepted = await record_outcomes(
                conn, "worker-bbbbbbbb", [(current, Outcome("succeeded", "succeeded"))], lambda j: 60
            )
        assert accepted == {job_id}
    assert await fetch(aconn, "SELECT attempt, worker_id, outcome FROM postbox.job_attempts ORDER BY attempt") == [
        (1, "worker-aaaaaaaa", "lost"),
        (2, "worker-bbbbbbbb", "succeeded"),
    ]


async def _claimed(
    aconn: psycopg.AsyncConnection[Any],
    redis: aioredis.Redis,
    prefix: str,
    pool: AsyncConnectionPool[Any],
    count: int,
    worker: str,
) -> tuple[list[Any], list[Job]]:
    """``count`` w_noop jobs enqueued, published, read and claimed by ``worker``: (deliveries, jobs by id)."""
    for _ in range(count):
        await enqueue(aconn, t.w_noop)
    stream = stream_key(prefix, t.QUEUE, 5)
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, prefix)
    deliveries, _, _ = await Consumer(redis, consumer=worker).read([stream], count)
    batch = await claims.claim(pool, deliveries, worker_id=worker, lease=30)
    return deliveries, sorted(batch.run, key=lambda job: job.id)


def _ctx(job: Job, worker: str, pool: AsyncConnectionPool[Any]) -> WorkerJobContext:
    return WorkerJobContext(job, worker_id=worker, pool=pool, registry=postbox.default_registry, deadline=None)


async def test_a_fence_refusing_at_commit_rolls_the_body_back_and_raises_stale_attempt(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    aconn = effects
    async with AsyncConnectionPool(database_url, min_size=1, max_size=3, kwargs={"autocommit": True}) as pool:
        deliveries, [stale] = await _claimed(aconn, redis, wsettings.redis_prefix, pool, 1, "worker-aaaaaaaa")
        ctx = _ctx(stale, "worker-aaaaaaaa", pool)
        with pytest.raises(StaleAttempt):
            async with ctx.transaction() as conn:
                await conn.execute("UPDATE worker_counter SET value = value + 1")
                async with conn.transaction():  # a savepoint inside the job's transaction
                    await conn.execute("UPDATE worker_counter SET value = value + 10")
                # While the body runs, its lease runs out and worker B takes the job over:
                # the fence refuses this run's success in the statement sent with COMMIT.
                await aconn.execute("UPDATE postbox.outbox SET lease_until = now() - interval '1 second'")
                await aconn.commit()
                deliveries[0].reclaimed = True
                [current] = (await claims.claim(pool, deliveries, worker_id="worker-bbbbbbbb", lease=30)).run
        assert not ctx.committed
        assert await fetchval(aconn, "SELECT value FROM worker_counter") == 0
        assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == 0
        # Taken over from a run among others: A's run recorded lost (Interrupted, not
        # charged), B runs the next attempt under its own claim.
        assert (stale.attempt, current.attempt) == (1, 2)
        assert await fetch(aconn, "SELECT state, attempts, claimed_by FROM postbox.outbox") == [
            ("running", 2, "worker-bbbbbbbb")
        ]
        # The connection went back to the pool idle (rolled back), and serves the current attempt.
        async with pool.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        ctx = _ctx(current, "worker-bbbbbbbb", pool)
        async with ctx.transaction() as conn:
            await conn.execute("UPDATE worker_counter SET value = value + 1")
        assert ctx.committed
    assert await fetchval(aconn, "SELECT value FROM worker_counter") == 1
    assert await fetch(aconn, "SELECT state, attempts, claimed_by FROM postbox.outbox") == [("succeeded", 2, None)]
    assert await fetch(aconn, "SELECT attempt, worker_id, outcome FROM postbox.job_attempts ORDER BY attempt") == [
        (1, "worker-aaaaaaaa", "lost"),
        (2, "worker-bbbbbbbb", "succeeded"),
    ]


async def test_a_body_that_commits_the_jobs_transaction_itself_gets_an_error_and_its_rerun_is_a_duplicate(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    aconn = effects
    async with AsyncConnectionPool(database_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        _, [job] = await _claimed(aconn, redis, wsettings.redis_prefix, pool, 1, "worker-aaaaaaaa")
        ctx = _ctx(job, "worker-aaaaaaaa", pool)
        with pytest.raises(RuntimeError, match=r"ended or failed inside ctx\.transaction\(\)"):
            async with ctx.transaction() as conn:
                await conn.execute("UPDATE worker_counter SET value = value + 1")
                await conn.commit()
        assert not ctx.committed
        # Committed with its processed row: the run's retry finds it, the success was not written.
        with pytest.raises(AlreadyProcessed):
            async with _ctx(job, "worker-aaaaaaaa", pool).transaction():
                pass
    assert await fetchval(aconn, "SELECT value FROM worker_counter") == 1
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == 1
    assert await fetch(aconn, "SELECT state, claimed_by FROM postbox.outbox") == [("running", "worker-aaaaaaaa")]


async def test_a_duplicate_run_waits_on_the_processed_row_then_raises_already_processed(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    aconn = effects
    async with AsyncConnectionPool(database_url, min_size=2, max_size=3, kwargs={"autocommit": True}) as pool:
        _, [job] = await _claimed(aconn, redis, wsettings.redis_prefix, pool, 1, "worker-aaaaaaaa")
        bodies: list[str] = []

        async def duplicate() -> None:
            async with _ctx(job, "worker-aaaaaaaa", pool).transaction() as conn:
                bodies.append("duplicate")
                await conn.execute("UPDATE worker_counter SET value = value + 1")

        first = _ctx(job, "worker-aaaaaaaa", pool)
        async with first.transaction() as conn:
            bodies.append("first")
            await conn.execute("UPDATE worker_counter SET value = value + 1")
            # A second run enters meanwhile: its processed row waits on this one's.
            second = asyncio.create_task(duplicate())
            await wait_until_async(
                lambda: fetchval(
                    aconn,
                    "SELECT count(*) = 1 FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%%begin_processed%%'",
                ),
                10,
                message="the duplicate waiting on the processed row",
            )
            assert not second.done()
        assert first.committed
        with pytest.raises(AlreadyProcessed):
            await asyncio.wait_for(second, 10)
        # A later run finds it committed at once.
        with pytest.raises(AlreadyProcessed):
            await duplicate()
        async with pool.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert bodies == ["first"]
    assert await fetchval(aconn, "SELECT value FROM worker_counter") == 1
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == 1
    assert await fetch(aconn, "SELECT state, claimed_by FROM postbox.outbox") == [("succeeded", None)]


# What a recorded success leaves, whichever statement wrote it (timestamps: set or not).
SUCCESS_ROW = """
SELECT o.state, o.attempts, o.claimed_by, o.lease_until, o.result, o.result_expires_at, o.last_error_class,
       o.last_error, o.finished_at IS NOT NULL, o.available_at = o.created_at, o.published_at IS NOT NULL,
       a.attempt, a.worker_id, a.outcome, a.error_class, a.error, a.traceback, a.started_at IS NOT NULL,
       a.finished_at IS NOT NULL
  FROM postbox.outbox o JOIN postbox.job_attempts a ON a.outbox_id = o.id
 WHERE o.id = %s
"""


async def test_the_success_in_a_transaction_writes_what_the_batched_outcome_writes(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    aconn = effects
    async with AsyncConnectionPool(database_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        _, [batched, in_tx] = await _claimed(aconn, redis, wsettings.redis_prefix, pool, 2, "worker-aaaaaaaa")
        async with pool.connection() as conn:
            recorded = await record_outcomes(
                conn, "worker-aaaaaaaa", [(batched, Outcome("succeeded", "succeeded"))], lambda _: 60, notify=False
            )
        assert recorded == {batched.id}
        async with _ctx(in_tx, "worker-aaaaaaaa", pool).transaction():
            pass
    [written] = await fetch(aconn, SUCCESS_ROW, (batched.id,))
    assert written == ("succeeded", 1, None, None, None, None, None, None, True, True, True,
                       1, "worker-aaaaaaaa", "succeeded", None, None, None, True, True)  # fmt: skip
    assert await fetch(aconn, SUCCESS_ROW, (in_tx.id,)) == [written]


async def test_xautoclaim_with_a_deleted_entry_still_completes_the_job(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    s = worker_settings(settings, visibility_timeout=1.0)
    job_id = await enqueue(aconn, t.w_add, {"a": 1, "b": 2})
    stream = stream_key(s.redis_prefix, t.QUEUE, 5)
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, s.redis_prefix)
    # A consumer reads the entry and vanishes; the entry is then deleted (trimmed).
    reply = await redis.xreadgroup(GROUP, "worker-dead0000", {stream: ">"}, count=1)
    entry_id = reply[0][1][0][0]
    await redis.xdel(stream, entry_id)
    assert (await redis.xpending(stream, GROUP))["pending"] == 1
    async with running_worker(s) as worker:
        # XAUTOCLAIM reports the id deleted: the job is made publishable again, not lost.
        lost = await asyncio.wait_for(worker.signals.lost.get(), 10)  # type: ignore[union-attr]
        assert lost == [job_id]
        assert await fetch(aconn, "SELECT state, published_at FROM postbox.outbox") == [("pending", None)]
        assert await publish_due(aconn, redis, s.redis_prefix) == [job_id]  # the relay's next pass
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts, result, publish_count FROM postbox.outbox") == [
        ("succeeded", 1, 3, 2)
    ]
    assert (await redis.xpending(stream, GROUP))["pending"] == 0


async def test_pause_then_resume(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    async with running_worker(wsettings) as worker:
        await aconn.execute("INSERT INTO postbox.queues (name, paused) VALUES (%s, true)", (t.QUEUE,))
        await aconn.commit()
        noticing = time.monotonic()
        await wait_until_async(lambda: t.QUEUE in worker.paused, 30, message="pause noticed")
        assert time.monotonic() - noticing <= 2.0
        job_id = await enqueue(aconn, t.w_noop)
        await publish_due(aconn, redis, wsettings.redis_prefix)
        # Paused: the entry stays unread for a while (a bounded negative check).
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(worker.signals.claimed.get(), 1.0)  # type: ignore[union-attr]
        assert await job_state(aconn, job_id) == "queued"
        await aconn.execute("UPDATE postbox.queues SET paused = false WHERE name = %s", (t.QUEUE,))
        await aconn.commit()
        resumed = time.monotonic()
        assert await finished(worker, 1) == [(job_id, "succeeded")]
        assert time.monotonic() - resumed <= 2.5


async def test_cancel_queued_job_never_runs(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    job_id = await enqueue(aconn, t.w_noop)
    await publish_due(aconn, redis, wsettings.redis_prefix)
    await aconn.execute("UPDATE postbox.outbox SET state = 'cancelled', finished_at = now() WHERE id = %s", (job_id,))
    await aconn.commit()
    async with running_worker(wsettings) as worker:
        assert await asyncio.wait_for(worker.signals.skipped.get(), 10) == job_id  # type: ignore[union-attr]
        assert worker.signals.started.qsize() == 0  # type: ignore[union-attr]
    assert await fetch(aconn, "SELECT state, attempts FROM postbox.outbox") == [("cancelled", 0)]
    assert await redis.xlen(stream_key(wsettings.redis_prefix, t.QUEUE, 5)) == 0


async def test_cancel_running_job_cooperatively(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    job_id = await enqueue(aconn, t.w_wait_cancel)
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await asyncio.wait_for(worker.signals.started.get(), 10) == job_id  # type: ignore[union-attr]
        await aconn.execute("UPDATE postbox.outbox SET cancel_requested_at = now() WHERE id = %s", (job_id,))
        await aconn.commit()
        asked = time.monotonic()
        assert await finished(worker, 1) == [(job_id, "cancelled")]
        assert time.monotonic() - asked <= 2.5
    assert await fetch(aconn, "SELECT state, attempts, finished_at IS NOT NULL FROM postbox.outbox") == [
        ("cancelled", 1, True)
    ]


async def test_expired_job_is_never_run(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=0.2)
    job_id = await enqueue(aconn, t.w_noop, expires_at=soon)
    await wait_until_async(
        lambda: fetchval(aconn, "SELECT expires_at < now() FROM postbox.outbox"), 5, message="expiry"
    )
    await publish_due(aconn, redis, wsettings.redis_prefix)
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 1) == [(job_id, "expired")]
        assert worker.signals.started.qsize() == 0  # type: ignore[union-attr]
    assert await fetch(aconn, "SELECT state, attempts FROM postbox.outbox") == [("expired", 0)]


async def test_deleted_entry_of_a_dead_workers_running_job_is_rescued(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    s = worker_settings(settings, visibility_timeout=1.0)
    job_id = await enqueue(aconn, t.w_add, {"a": 2, "b": 2})
    stream = stream_key(s.redis_prefix, t.QUEUE, 5)
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, s.redis_prefix)
    from postbox.worker.consumer import Consumer

    deliveries, _, _ = await Consumer(redis, consumer="worker-dead0001").read([stream], 1)
    async with AsyncConnectionPool(database_url, min_size=1, kwargs={"autocommit": True}) as pool:
        claimed = await claims.claim(pool, deliveries, worker_id="worker-dead0001", lease=1.0)
    assert [job.id for job in claimed.run] == [job_id]
    await redis.xdel(stream, deliveries[0].entry_id)  # the worker dies; its entry is gone too
    async with running_worker(s) as worker:
        assert await asyncio.wait_for(worker.signals.lost.get(), 10) == [job_id]  # type: ignore[union-attr]
        assert await publish_due(aconn, redis, s.redis_prefix) == [job_id]
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT attempt, worker_id, outcome FROM postbox.job_attempts ORDER BY attempt") == [
        (1, "worker-dead0001", "lost"),
        (2, worker.id, "succeeded"),
    ]
