"""Issue 14, the worker's side: bad text, stuck sync handlers, unknown tasks."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

from postbox.outcomes import Outcome
from postbox.registry import Registry, task
from postbox.settings import Settings
from postbox.worker import claims
from postbox.worker.completer import Finished
from postbox.worker.consumer import Consumer, ensure_groups
from postbox.worker.delivery import Delivery, Job
from tests.harness.publish import publish_due
from tests.harness.tasks import hardening as h
from tests.harness.wait import wait_until_async
from tests.harness.worker import (
    completer_of_worker_test,
    enqueue,
    fetch,
    finished,
    running_jobs,
    running_worker,
    small_pool,
    worker_settings,
)


async def test_unencodable_text_is_stored_safely_and_blocks_nothing(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    """A lone surrogate or a NUL in an error or a kept result: every outcome is recorded."""
    retried = await enqueue(aconn, h.h_surrogate_error)
    last = await enqueue(aconn, h.h_surrogate_error_last)
    kept = await enqueue(aconn, h.h_surrogate_result)
    fine = await enqueue(aconn, h.h_sync_pid)
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        got = dict(await finished(worker, 4))
        assert got == {retried: "retry", last: "dead", kept: "succeeded", fine: "succeeded"}
        await wait_until_async(
            lambda: publish_due(aconn, redis, wsettings.redis_prefix), 10, message="the retry published"
        )
        assert await finished(worker, 1) == [(retried, "dead")]
    rows = await fetch(aconn, "SELECT id, state, last_error_class, last_error, result FROM postbox.outbox ORDER BY id")
    bad = "report-\\udcff.pdf"
    assert rows[0] == (
        retried,
        "dead",
        "FileNotFoundError",
        f"attempts exhausted (2/2): {bad}",
        {"error": {"class": "FileNotFoundError", "message": f"attempts exhausted (2/2): {bad}"}},
    )
    message = f"attempts exhausted (1/1): [Errno 2] No such file or directory : '{bad}'"  # the NUL: a space
    assert rows[1] == (
        last,
        "dead",
        "FileNotFoundError",
        message,
        {"error": {"class": "FileNotFoundError", "message": message}},
    )
    assert rows[2] == (kept, "succeeded", None, None, {"name": bad, "nul": "ab", bad: [bad]})
    assert rows[3][1] == "succeeded"
    history = await fetch(
        aconn, "SELECT outbox_id, attempt, outcome, error FROM postbox.job_attempts ORDER BY outbox_id, attempt"
    )
    assert history[:2] == [(retried, 1, "retry", bad), (retried, 2, "dead", f"attempts exhausted (2/2): {bad}")]


async def test_the_completer_isolates_a_row_the_database_refuses(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    """A batch with rows PostgreSQL refuses: the others are recorded, the bad ones in a safe form."""
    ids = await running_jobs(aconn, h.h_sync_pid, 4)
    stream = f"{wsettings.redis_prefix}:{{wtest}}:p5"
    items = [
        (ids[0], Outcome("succeeded", "succeeded", result='{"ok": 1}')),
        # Not through outcomes.*: texts as no sanitizer left them, refused by the client or the server.
        (ids[1], Outcome("retrying", "retry", delay=60.0, error_class="OSError", error="bad \udcff name")),
        (ids[2], Outcome("succeeded", "succeeded", result='{"nul": "a\\u0000b"}')),
        (ids[3], Outcome("dead", "dead", result='{"x": 1}', error_class="E\x00", error="boom")),
    ]
    done: asyncio.Queue[list[Finished]] = asyncio.Queue()
    async with small_pool(wsettings) as pool:
        completer = completer_of_worker_test(pool, redis, wsettings, done.put_nowait)
        runner = asyncio.create_task(completer.run())
        try:
            for n, (job_id, outcome) in enumerate(items):
                delivery = Delivery(stream, b"%d-0" % (n + 1), job_id, "h_sync_pid", "{}", "{}", "wtest", 5, 0)
                completer.add(Finished(delivery, Job(delivery, 1, 5, None, True, 0), outcome))
            batch = await asyncio.wait_for(done.get(), 20)
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
    assert [f.recorded for f in batch] == [True, True, True, True]
    rows = await fetch(aconn, "SELECT state, result, last_error_class, last_error FROM postbox.outbox ORDER BY id")
    note = "the outcome's text could not be stored"
    assert rows == [
        ("succeeded", {"ok": 1}, None, None),
        ("retrying", None, "OSError", f"bad \\udcff name ({note})"),
        ("succeeded", None, None, note),
        ("dead", {"error": {"class": "E", "message": f"boom ({note})"}}, "E", f"boom ({note})"),
    ]


async def test_a_stuck_sync_handler_times_out_and_never_starves_the_next_jobs(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    """Timeouts end sync jobs; the stuck threads hold no slot and no thread the next job needs."""
    h.RELEASE.clear()
    wsettings = worker_settings(settings, concurrency=1)
    stuck = [await enqueue(aconn, h.h_sync_timeout) for _ in range(3)]
    fine = await enqueue(aconn, h.h_sync_pid)
    try:
        async with running_worker(wsettings) as worker:
            await publish_due(aconn, redis, wsettings.redis_prefix)
            got = await finished(worker, 4, within=20)
            published: list[int] = []

            async def all_retries_published() -> bool:
                published.extend(await publish_due(aconn, redis, wsettings.redis_prefix))
                return len(published) == 3

            await wait_until_async(all_retries_published, 10, message="retries published")
            got += await finished(worker, 3, within=20)
            assert worker.threads.abandoned == 6
    finally:
        h.RELEASE.set()
    assert sorted(got) == sorted(
        [(job_id, "retry") for job_id in stuck] + [(job_id, "dead") for job_id in stuck] + [(fine, "succeeded")]
    )
    assert await fetch(aconn, "SELECT DISTINCT last_error_class FROM postbox.outbox WHERE id = ANY(%s)", (stuck,)) == [
        ("JobTimeout",)
    ]


async def test_cancelling_a_stuck_sync_handler_ends_its_job(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    h.RELEASE.clear()
    job_id = await enqueue(aconn, h.h_sync_stuck)
    try:
        async with running_worker(wsettings) as worker:
            await publish_due(aconn, redis, wsettings.redis_prefix)
            assert worker.signals.started is not None
            assert await asyncio.wait_for(worker.signals.started.get(), 15) == job_id
            await aconn.execute("UPDATE postbox.outbox SET cancel_requested_at = now() WHERE id = %s", (job_id,))
            await aconn.commit()
            assert await finished(worker, 1, within=10) == [(job_id, "cancelled")]
            assert worker.threads.abandoned == 1
    finally:
        h.RELEASE.set()
    assert await fetch(aconn, "SELECT state FROM postbox.outbox") == [("cancelled",)]


async def _insert_job_of_unknown_task(aconn: psycopg.AsyncConnection[Any], task_name: str) -> int:
    """A job enqueued by newer code: its task is not in this process's registry."""
    cur = await aconn.execute(
        "INSERT INTO postbox.outbox (queue, task, args, max_attempts) VALUES ('wtest', %s, '{}', 3) RETURNING id",
        (task_name,),
    )
    row = await cur.fetchone()
    await aconn.commit()
    assert row is not None
    return int(row[0])


async def test_a_job_of_an_unknown_task_is_handed_back_for_a_worker_that_knows_it(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    wsettings = worker_settings(settings, unknown_task_grace=60.0)
    job_id = await _insert_job_of_unknown_task(aconn, "h_deployed_later")
    async with running_worker(wsettings) as old:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert old.signals.skipped is not None
        assert await asyncio.wait_for(old.signals.skipped.get(), 15) == job_id
        await old.wait_idle()
    row = await fetch(
        aconn,
        "SELECT state, attempts, published_at IS NULL, available_at > now(), last_error_class, last_error"
        " FROM postbox.outbox",
    )
    assert row == [
        (
            "pending",
            0,
            True,
            True,
            "UnknownTaskError",
            f"task h_deployed_later is not registered on {old.id}; handed back for a worker that knows it",
        )
    ]
    assert await redis.xlen(f"{wsettings.redis_prefix}:{{wtest}}:p5") == 0  # acknowledged and deleted

    newer = Registry()

    @task(name="h_deployed_later", queue="wtest", registry=newer)
    async def deployed_later(ctx: Any) -> None:
        return None

    await aconn.execute("UPDATE postbox.outbox SET available_at = now()")  # skip the hand-back delay
    await aconn.commit()
    async with running_worker(wsettings, registry=newer) as new:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(new, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts FROM postbox.outbox") == [("succeeded", 1)]


async def test_a_job_nobody_knows_is_dead_lettered_after_the_grace_period(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    wsettings = worker_settings(settings, unknown_task_grace=1.0)
    job_id = await _insert_job_of_unknown_task(aconn, "h_never_deployed")
    async with running_worker(wsettings) as worker:
        started = asyncio.get_running_loop().time()
        outcome: list[tuple[int, str]] = []

        async def dead_lettered() -> bool:
            await publish_due(aconn, redis, wsettings.redis_prefix)
            assert worker.signals.finished is not None
            if not worker.signals.finished.empty():
                outcome.append(worker.signals.finished.get_nowait())
            return bool(outcome)

        await wait_until_async(dead_lettered, 15, message="the job dead-lettered")
        waited = asyncio.get_running_loop().time() - started
    assert outcome == [(job_id, "dead")]
    assert waited >= 1.0
    assert await fetch(aconn, "SELECT state, attempts, last_error_class, last_error FROM postbox.outbox") == [
        (
            "dead",
            1,
            "UnknownTaskError",
            "no handler is registered for task 'h_never_deployed' on this worker, and no worker took the job"
            " within the grace period (POSTBOX_UNKNOWN_TASK_GRACE=1 s)",
        )
    ]


async def test_a_run_lost_among_others_is_not_charged_and_its_takeover_runs_alone(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    """Worker A dies running several jobs: B takes them over, charges none, runs each alone."""
    ids = [await enqueue(aconn, h.h_overlap) for _ in range(3)]
    h.MOST_AT_ONCE[0] = 0
    stream = f"{wsettings.redis_prefix}:{{wtest}}:p5"
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, wsettings.redis_prefix)
    deliveries, _, _ = await Consumer(redis, consumer="worker-aaaaaaaa").read([stream], 10)
    async with AsyncConnectionPool(database_url, min_size=1, kwargs={"autocommit": True}) as pool:
        first = await claims.claim(pool, deliveries, worker_id="worker-aaaaaaaa", lease=30)
    assert [job.isolate for job in first.run] == [False, False, False]
    # A dies (its lease runs out): every attempt was used (max_attempts 1), yet none is charged.
    await aconn.execute("UPDATE postbox.outbox SET lease_until = now() - interval '1 second'")
    await aconn.commit()
    async with running_worker(wsettings.model_copy(update={"visibility_timeout": 0.5})) as worker:
        got = await finished(worker, 3)
    assert sorted(got) == [(job_id, "succeeded") for job_id in ids]
    rows = await fetch(aconn, "SELECT state, attempts, last_error_class, started_at FROM postbox.outbox ORDER BY id")
    # Each lost run is in the history (lost, Interrupted), counted but not charged: the
    # takeover ran as attempt 2 of a budget grown by one, so the job was not dead-lettered.
    assert [row[:3] for row in rows] == [("succeeded", 2, "Interrupted")] * 3
    assert await fetch(
        aconn, "SELECT outbox_id, attempt, worker_id, outcome, error_class FROM postbox.job_attempts ORDER BY 1, 2"
    ) == [
        row
        for job_id in ids
        for row in ((job_id, 1, "worker-aaaaaaaa", "lost", "Interrupted"), (job_id, 2, worker.id, "succeeded", None))
    ]
    assert h.MOST_AT_ONCE == [1]  # alone: never two at once (three at once before)


async def test_a_job_whose_args_this_worker_refuses_is_handed_back_for_a_worker_that_accepts_them(
    settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    """Newer producers add an argument the older workers' handler does not take yet (rolling deploy)."""
    wsettings = worker_settings(settings, unknown_task_grace=60.0)
    cur = await aconn.execute(
        "INSERT INTO postbox.outbox (queue, task, args, keep_result) VALUES ('wtest', 'w_add', %s, true) RETURNING id",
        ('{"a": 1, "b": 2, "c": 3}',),
    )
    row = await cur.fetchone()
    await aconn.commit()
    assert row is not None
    job_id = int(row[0])
    async with running_worker(wsettings) as old:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert old.signals.skipped is not None
        assert await asyncio.wait_for(old.signals.skipped.get(), 15) == job_id
        await old.wait_idle()
    assert await fetch(aconn, "SELECT state, attempts, last_error_class, last_error FROM postbox.outbox") == [
        (
            "pending",
            0,
            "InvalidArgsError",
            f"the args of task w_add are refused by its handler on {old.id};"
            " handed back for a worker that accepts them",
        )
    ]

    newer = Registry()

    @task(name="w_add", queue="wtest", registry=newer, keep_result=True)
    async def add3(ctx: Any, a: int, b: int, c: int = 0) -> int:
        return a + b + c

    await aconn.execute("UPDATE postbox.outbox SET available_at = now()")  # skip the hand-back delay
    await aconn.commit()
    async with running_worker(wsettings, registry=newer) as new:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(new, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts, result FROM postbox.outbox") == [("succeeded", 1, 6)]
