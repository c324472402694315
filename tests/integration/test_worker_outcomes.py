"""The worker on real PostgreSQL and Redis: outcomes, retries, dead letters, ctx, results."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

import postbox
from postbox.relay import Relay
from postbox.settings import Settings
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch, fetchval, finished, running_worker


async def history(aconn: psycopg.AsyncConnection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return await fetch(
        aconn,
        "SELECT attempt, outcome, error_class FROM postbox.job_attempts WHERE outbox_id = %s ORDER BY attempt",
        (job_id,),
    )


async def test_success_is_recorded_then_acknowledged_and_deleted(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    job_id = await enqueue(aconn, t.w_add, {"a": 2, "b": 3})
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    row = await fetch(
        aconn, "SELECT state, attempts, result, claimed_by, lease_until, finished_at IS NOT NULL FROM postbox.outbox"
    )
    assert row == [("succeeded", 1, 5, None, None, True)]
    assert await fetch(aconn, "SELECT attempt, worker_id, outcome FROM postbox.job_attempts") == [
        (1, worker.id, "succeeded")
    ]
    stream = f"{wsettings.redis_prefix}:{{{t.QUEUE}}}:p5"
    assert await redis.xlen(stream) == 0  # XACK + XDEL after the commit
    assert (await redis.xpending(stream, "postbox"))["pending"] == 0
    assert await fetchval(aconn, "SELECT processed FROM postbox.workers WHERE id = %s", (worker.id,)) == 1


async def test_sync_handler_runs_in_a_thread_and_keeps_its_result(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    job_id = await enqueue(aconn, t.w_sync_add, {"a": 40, "b": 2})
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, result, result_expires_at > now() FROM postbox.outbox") == [
        ("succeeded", {"sum": 42, "thread": 1}, True)
    ]


async def test_retry_with_backoff_then_success(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_flaky, {"fail_times": 2})
    async with running_worker(wsettings) as worker:
        outcomes = await finished(worker, 3)
    assert outcomes == [(job_id, "retry"), (job_id, "retry"), (job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts, result, publish_count FROM postbox.outbox") == [
        ("succeeded", 3, "ok on attempt 3", 3)
    ]
    assert await history(aconn, job_id) == [
        (1, "retry", "RuntimeError"),
        (2, "retry", "RuntimeError"),
        (3, "succeeded", None),
    ]
    # attempt 2 started no sooner than the backoff after attempt 1 (base 0.05 s, no jitter)
    gap = await fetchval(
        aconn,
        "SELECT extract(epoch FROM b.started_at - a.finished_at) FROM postbox.job_attempts a, postbox.job_attempts b"
        " WHERE a.outbox_id = %s AND b.outbox_id = a.outbox_id AND a.attempt = 1 AND b.attempt = 2",
        (job_id,),
    )
    assert float(gap) >= 0.05
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 1


async def test_retry_later_counts_as_an_attempt(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_retry_later, {"seconds": 0.3})
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 2) == [(job_id, "retry"), (job_id, "succeeded")]
    assert await history(aconn, job_id) == [(1, "retry", "RetryLater"), (2, "succeeded", None)]
    gap = await fetchval(
        aconn,
        "SELECT extract(epoch FROM b.started_at - a.finished_at) FROM postbox.job_attempts a, postbox.job_attempts b"
        " WHERE a.outbox_id = %s AND b.outbox_id = a.outbox_id AND a.attempt = 1 AND b.attempt = 2",
        (job_id,),
    )
    assert float(gap) >= 0.3


async def test_permanent_error_is_dead_at_once(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    job_id = await enqueue(aconn, t.w_permanent)
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 1) == [(job_id, "dead")]
    assert await fetch(aconn, "SELECT state, attempts, last_error_class, last_error, result FROM postbox.outbox") == [
        (
            "dead",
            1,
            "PermanentError",
            "card declined",
            {"error": {"class": "PermanentError", "message": "card declined"}},
        )
    ]
    assert await history(aconn, job_id) == [(1, "dead", "PermanentError")]


async def test_exhausted_attempts_are_dead_with_their_history(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    job_id = await enqueue(aconn, t.w_always_fails)
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 3) == [(job_id, "retry"), (job_id, "retry"), (job_id, "dead")]
    state, attempts, error_class, error = (
        await fetch(aconn, "SELECT state, attempts, last_error_class, last_error FROM postbox.outbox")
    )[0]
    assert (state, attempts, error_class) == ("dead", 3, "ValueError")
    assert len(error) == 500 and "\n" not in error and error.startswith("attempts exhausted (3/3): boom second line")
    assert await history(aconn, job_id) == [
        (1, "retry", "ValueError"),
        (2, "retry", "ValueError"),
        (3, "dead", "ValueError"),
    ]


async def test_timeout_is_retried_then_dead(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    job_id = await enqueue(aconn, t.w_too_slow)
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 2) == [(job_id, "retry"), (job_id, "dead")]
    assert await history(aconn, job_id) == [(1, "retry", "JobTimeout"), (2, "dead", "JobTimeout")]


async def test_unknown_task_without_a_grace_period_is_dead_at_once_and_nothing_runs(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    wsettings = wsettings.model_copy(update={"unknown_task_grace": 0.0})  # handed back first: test_worker_hardening
    job_id = await fetchval(aconn, "SELECT postbox.enqueue('no_such_task', '{}'::jsonb, %s)", (t.QUEUE,))
    bad_args = await fetchval(aconn, "SELECT postbox.enqueue('w_add', '{\"a\": \"x\"}'::jsonb, %s)", (t.QUEUE,))
    async with running_worker(wsettings) as worker:
        assert sorted(await finished(worker, 2)) == sorted([(job_id, "dead"), (bad_args, "dead")])
    rows = await fetch(aconn, "SELECT id, state, attempts, last_error_class FROM postbox.outbox ORDER BY id")
    assert rows == [(job_id, "dead", 1, "UnknownTaskError"), (bad_args, "dead", 1, "InvalidArgsError")]


async def test_ctx_transaction_commits_effect_and_outcome_together_and_enqueues_through_the_outbox(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = effects
    parent = await enqueue(aconn, t.w_enqueue_child, {"n": 3})
    async with running_worker(wsettings) as worker:
        got = await finished(worker, 4)
    # Every job's outcome, in any order: a child can be acknowledged before its parent (the
    # parent's commit publishes it, and the parent's own ack may come a flush later).
    ids = [row[0] for row in await fetch(aconn, "SELECT id FROM postbox.outbox ORDER BY id")]
    assert ids[0] == parent and sorted(got) == [(job_id, "succeeded") for job_id in ids]
    rows = await fetch(aconn, "SELECT task, state, result FROM postbox.outbox ORDER BY id")
    assert rows == [
        ("w_enqueue_child", "succeeded", None),
        ("w_add", "succeeded", 1),
        ("w_add", "succeeded", 2),
        ("w_add", "succeeded", 3),
    ]
    assert await fetch(aconn, "SELECT outbox_id FROM postbox.processed_jobs") == [(parent,)]


async def test_already_processed_job_is_absorbed_as_a_duplicate(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_count)
    await aconn.execute("INSERT INTO postbox.processed_jobs (outbox_id) VALUES (%s)", (job_id,))
    await aconn.commit()
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(worker, 1) == [(job_id, "duplicate")]
    assert await fetchval(aconn, "SELECT value FROM worker_counter") == 0
    assert await fetch(aconn, "SELECT state FROM postbox.outbox") == [("succeeded",)]
    assert await history(aconn, job_id) == [(1, "duplicate", None)]


async def test_wait_result_returns_value_of_finished_and_error_of_dead(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay, database_url: str
) -> None:
    aconn = effects
    ok = await enqueue(aconn, t.w_add, {"a": 20, "b": 22})
    bad = await enqueue(aconn, t.w_permanent)
    in_tx = await enqueue(aconn, t.w_flaky, {"fail_times": 0})  # succeeds inside ctx.transaction()
    waiters = [
        asyncio.create_task(postbox.wait_result(job_id, 20, database_url=database_url)) for job_id in (ok, bad, in_tx)
    ]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    async with running_worker(wsettings):
        good, dead, committed = await asyncio.gather(*waiters)
    assert (good.state, good.value, good.ok) == ("succeeded", 42, True)
    assert (dead.state, dead.error_class, dead.error, dead.ok) == ("dead", "PermanentError", "card declined", False)
    assert (committed.state, committed.value) == ("succeeded", "ok on attempt 1")
    with psycopg.connect(database_url) as conn:
        assert postbox.get_result(conn, ok) == good
        assert postbox.get_result(conn, 10**9) is None
    with pytest.raises(TimeoutError):
        pending = await enqueue(aconn, t.w_add, {"a": 1, "b": 1}, delay=60)
        await postbox.wait_result(pending, 0.3, database_url=database_url)
    with pytest.raises(LookupError):
        await postbox.wait_result(10**9, 1, database_url=database_url)
