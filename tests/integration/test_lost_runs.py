"""A run lost with its worker, in the job's history: written once, by the claim that takes it over.

Issue 28: a run lost among other jobs (its worker died while running several)
left no history row at all. It is now recorded ``lost`` with error class
``Interrupted`` — still not charged: the takeover runs the next attempt number
on a budget one larger. Real PostgreSQL and Redis; the claims are the worker's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

from postbox.settings import Settings
from postbox.worker import claims
from postbox.worker.consumer import Consumer, ensure_groups
from tests.harness.publish import publish_due
from tests.harness.tasks import hardening as h
from tests.harness.worker import enqueue, fetch


async def test_two_workers_taking_over_one_lost_run_record_it_once_and_one_of_them_runs_it(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    job_id = await enqueue(aconn, h.h_overlap)  # max_attempts 1
    stream = f"{wsettings.redis_prefix}:{{wtest}}:p5"
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, wsettings.redis_prefix)
    deliveries, _, _ = await Consumer(redis, consumer="worker-aaaaaaaa").read([stream], 10)
    async with AsyncConnectionPool(database_url, min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
        first = await claims.claim(pool, deliveries, worker_id="worker-aaaaaaaa", lease=30)
        assert [(job.id, job.attempt, job.isolate) for job in first.run] == [(job_id, 1, False)]
        # A dies while running it (among others, as far as anyone can tell): its lease runs out.
        await aconn.execute("UPDATE postbox.outbox SET lease_until = now() - interval '1 second'")
        await aconn.commit()
        for delivery in deliveries:
            delivery.reclaimed = True
        b, c = await asyncio.gather(
            claims.claim(pool, deliveries, worker_id="worker-bbbbbbbb", lease=30),
            claims.claim(pool, deliveries, worker_id="worker-cccccccc", lease=30),
        )
    winners = [(name, batch.run) for name, batch in (("worker-bbbbbbbb", b), ("worker-cccccccc", c)) if batch.run]
    assert len(winners) == 1, (b, c)
    [(winner, [job])] = winners
    # The takeover runs attempt 2, alone, on a budget one larger: the lost run is not charged.
    assert (job.id, job.attempt, job.max_attempts, job.isolate) == (job_id, 2, 2, True)
    loser = c if winner == "worker-bbbbbbbb" else b
    assert loser.run == [] and [d.job_id for d in loser.keep] == [job_id]  # left pending: running elsewhere
    assert await fetch(aconn, "SELECT state, attempts, max_attempts, claimed_by FROM postbox.outbox") == [
        ("running", 2, 1, winner)
    ]
    assert await fetch(
        aconn,
        "SELECT attempt, worker_id, outcome, error_class, finished_at IS NOT NULL FROM postbox.job_attempts",
    ) == [(1, "worker-aaaaaaaa", "lost", "Interrupted", True)]
