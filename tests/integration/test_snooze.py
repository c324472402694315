"""Snooze (postbox.Snooze): "not yet" without consuming an attempt, bounded, in the history.

Real PostgreSQL and Redis, the real relay and worker in this event loop; the
Redis-loss case uses a private Redis server (never FLUSHALL the shared one).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import postbox
from postbox.relay import Relay
from postbox.settings import Settings
from postbox.testing import run_enqueued
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401 - fixture
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch, fetchval, finished, running_worker


async def history(aconn: psycopg.AsyncConnection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return await fetch(
        aconn,
        "SELECT attempt, outcome, error_class, error FROM postbox.job_attempts WHERE outbox_id = %s ORDER BY attempt",
        (job_id,),
    )


async def test_a_snooze_gives_its_attempt_back_and_is_in_the_history(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_snooze, {"times": 2, "seconds": 0.2})
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 3) == [(job_id, "snoozed"), (job_id, "snoozed"), (job_id, "succeeded")]
    # max_attempts=2 and two snoozes: the budget grew by one per snooze, and the third run
    # was attempt 3 of 4, not the end of the job.
    assert await fetch(aconn, "SELECT state, attempts, max_attempts, publish_count FROM postbox.outbox") == [
        ("succeeded", 3, 4, 3)
    ]
    assert await history(aconn, job_id) == [
        (1, "snoozed", "Snooze", "snoozed for 0.2s (1 of 2): not yet (1)"),
        (2, "snoozed", "Snooze", "snoozed for 0.2s (2 of 2): not yet (2)"),
        (3, "succeeded", None, None),
    ]
    gaps = await fetch(
        aconn,
        "SELECT extract(epoch FROM b.started_at - a.finished_at) FROM postbox.job_attempts a, postbox.job_attempts b"
        " WHERE a.outbox_id = %s AND b.outbox_id = a.outbox_id AND b.attempt = a.attempt + 1 ORDER BY a.attempt",
        (job_id,),
    )
    assert [float(g) >= 0.2 for (g,) in gaps] == [True, True]
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 1


async def test_a_returned_snooze_is_a_snooze(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_snooze, {"times": 1, "returned": True})
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 2) == [(job_id, "snoozed"), (job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts, max_attempts, result FROM postbox.outbox") == [
        ("succeeded", 2, 3, None)
    ]


async def test_snoozes_past_the_bound_count_as_attempts_and_the_job_ends(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = effects
    job_id = await enqueue(aconn, t.w_snooze, {"times": 100, "seconds": 0})
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 4) == [
            (job_id, "snoozed"),
            (job_id, "snoozed"),
            (job_id, "retry"),  # max_snoozes=2: the third snooze is counted, like RetryLater
            (job_id, "dead"),
        ]
    assert await fetch(
        aconn, "SELECT state, attempts, max_attempts, last_error_class, last_error FROM postbox.outbox"
    ) == [
        (
            "dead",
            4,
            4,
            "Snooze",
            "attempts exhausted (4/4): snooze limit reached (2), counted as an attempt: not yet (4)",
        )
    ]
    assert [row[:3] for row in await history(aconn, job_id)] == [
        (1, "snoozed", "Snooze"),
        (2, "snoozed", "Snooze"),
        (3, "retry", "Snooze"),
        (4, "dead", "Snooze"),
    ]
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 0


async def test_a_snoozed_job_survives_a_redis_flush_and_runs_once(
    wsettings: Settings,
    effects: psycopg.AsyncConnection[Any],
    private_redis: RedisServer,  # noqa: F811
) -> None:
    """The snooze is a row in PostgreSQL (retrying, unpublished, due later): Redis holds nothing of it."""
    aconn = effects
    settings = wsettings.model_copy(update={"redis_url": private_redis.url})
    job_id = await enqueue(aconn, t.w_snooze, {"times": 1, "seconds": 1.0})
    relay = Relay(settings)
    relay_task = asyncio.create_task(relay.run())
    try:
        async with running_worker(settings) as worker:
            assert await finished(worker, 1) == [(job_id, "snoozed")]
            private_redis.client().flushall()
            assert await finished(worker, 1) == [(job_id, "succeeded")]
    finally:
        relay.stop()
        await asyncio.wait_for(relay_task, 10)
    assert await fetch(aconn, "SELECT state, attempts, max_attempts FROM postbox.outbox") == [("succeeded", 2, 3)]
    assert [row[:2] for row in await history(aconn, job_id)] == [(1, "snoozed"), (2, "succeeded")]
    assert await fetchval(aconn, "SELECT count(*) FROM worker_effects") == 1


async def test_inline_runs_snooze_as_the_worker_does(effects: psycopg.AsyncConnection[Any]) -> None:
    aconn = effects
    job_id = await postbox.enqueue_async(aconn, t.w_snooze, {"times": 1})
    runs = await run_enqueued(aconn)
    assert [(r.job_id, r.attempt, r.state, r.error_class) for r in runs] == [
        (job_id, 1, "retrying", "Snooze"),
        (job_id, 2, "succeeded", None),
    ]
    assert await fetch(aconn, "SELECT state, attempts, max_attempts FROM postbox.outbox") == [("succeeded", 2, 3)]
    assert [row[:2] for row in await history(aconn, job_id)] == [(1, "snoozed"), (2, "succeeded")]
    await aconn.rollback()
