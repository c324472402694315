"""A run whose claim beat the relay's mark is not lost with its worker and its entry.

The relay XADDs a batch, then marks its rows published. A worker can read an
entry and claim its job in between: the claim moves the row to ``running`` and
the mark, finding it no longer pending, skips it. The row must still name the
entry its run came in (the claim records it): if the worker then dies and Redis
loses the entry while the lease is still live (the relay's recovery skips a live
run), the sweep is what finds the run, and it looks only at the entry the row
names. Before the claim recorded it, such a row named no entry, the sweep never
selected it, and the job stayed ``running`` forever with its workflow's
dependents ``waiting`` (the workflow fault test, on a loaded machine).

The interleaving is made exact with the relay's ``before_mark`` hook; the relay
runs in this event loop, the claims are the worker's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

import postbox
from postbox.relay.service import RelaySignals
from postbox.settings import Settings
from postbox.streams import stream_key
from postbox.worker import claims
from postbox.worker.consumer import Consumer, ensure_groups
from tests.harness.relay import running_relay
from tests.harness.tasks import workflow as w
from tests.harness.wait import wait_event, wait_until_async
from tests.harness.worker import enqueue, fetch

A, B = "worker-aaaaaaaa", "worker-bbbbbbbb"


async def drop_keys(redis: aioredis.Redis, prefix: str) -> int:
    """This test's streams, groups and epoch deleted: Redis lost its data."""
    keys = [key async for key in redis.scan_iter(match=f"{prefix}:*", count=1000)]
    return int(await redis.delete(*keys)) if keys else 0


async def collect(queue: asyncio.Queue[list[int]] | None, want: int, within: float) -> list[int]:
    assert queue is not None
    got: list[int] = []
    async with asyncio.timeout(within):
        while want not in got:
            got += await queue.get()
    return got


async def test_a_run_claimed_before_the_relays_mark_is_republished_once_its_worker_and_its_entry_are_lost(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, database_url: str
) -> None:
    prefix = wsettings.redis_prefix
    stream = stream_key(prefix, w.QUEUE, 5)
    await ensure_groups(redis, [stream])
    claimed: list[claims.ClaimBatch] = []
    async with AsyncConnectionPool(database_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:

        async def claim_before_mark(ids: list[int]) -> None:
            # Between the relay's XADD and its mark: worker A reads the entry and claims the job.
            if not claimed:
                deliveries, _, _ = await Consumer(redis, consumer=A).read([stream], 10)
                claimed.append(await claims.claim(pool, deliveries, worker_id=A, lease=30))

        signals = RelaySignals.all()
        signals.before_mark = claim_before_mark
        async with running_relay(wsettings, signals=signals, sweep_interval=0.2, sweep_min_age=0.3) as (relay, _):
            job_id = await enqueue(aconn, w.wf_step, {"label": "head"})
            await wait_until_async(lambda: bool(claimed), 15, message="worker A claimed before the mark")
            [job] = claimed[0].run
            assert (job.id, job.attempt) == (job_id, 1)
            entry = job.delivery.entry_id.decode()
            # The mark found the row running and skipped it; the row names the entry A's run came in.
            assert await fetch(
                aconn, "SELECT state, claimed_by, publish_count, stream_id FROM postbox.outbox WHERE id = %s", (job_id,)
            ) == [("running", A, 1, entry)]

            # Redis loses everything while A's lease is live: the recovery has no stale run to republish.
            reconciler = relay.reconciler
            assert reconciler is not None and signals.redis_loss is not None
            await wait_until_async(lambda: not reconciler.recovering, 15, message="the first epoch set")
            signals.redis_loss.clear()  # a fresh Redis looked lost at the start
            assert await drop_keys(redis, prefix) > 0
            await wait_event(signals.redis_loss, 15, message="the relay noticed the loss")
            await wait_until_async(lambda: not reconciler.recovering, 15, message="the recovery finished")
            assert relay.republished_total == 0

            # A dies: its lease runs out. Its entry is gone with Redis's data; the sweep republishes the job.
            await aconn.execute(
                "UPDATE postbox.outbox SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,)
            )
            await aconn.commit()
            assert job_id in await collect(signals.republished, job_id, 15)
            assert relay.republished_total == 1

        # Worker B reads the new entry and takes the run over: attempt 2, alone (A's run is not charged).
        await ensure_groups(redis, [stream])
        deliveries, _, _ = await Consumer(redis, consumer=B).read([stream], 10)
        taken = await claims.claim(pool, deliveries, worker_id=B, lease=30)
    assert [(j.id, j.attempt, j.isolate) for j in taken.run] == [(job_id, 2, True)]
    [run] = taken.run
    assert await fetch(
        aconn, "SELECT state, claimed_by, attempts, stream_id FROM postbox.outbox WHERE id = %s", (job_id,)
    ) == [("running", B, 2, run.delivery.entry_id.decode())]
    assert await fetch(
        aconn,
        "SELECT attempt, worker_id, outcome, error_class FROM postbox.job_attempts WHERE outbox_id = %s",
        (job_id,),
    ) == [(1, A, "lost", "Interrupted")]


async def test_a_stale_run_naming_no_entry_is_republished_by_the_sweep(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    """A running row with no entry recorded (claimed from a worker's parking, or by an older worker)."""
    stream = stream_key(wsettings.redis_prefix, w.QUEUE, 5)
    await ensure_groups(redis, [stream])
    async with running_relay(wsettings, sweep_interval=0.2, sweep_min_age=0.3) as (relay, signals):
        await wait_event(signals.leader, 15, message="leading")
        # Inserted running (in one transaction: the relay never sees them due).
        live = await postbox.enqueue_async(aconn, w.wf_step, {"label": "live"})
        stale = await postbox.enqueue_async(aconn, w.wf_step, {"label": "stale"})
        await aconn.execute(
            """UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = %s, stream_id = NULL,
                      published_at = now(), publish_count = 1,
                      lease_until = now() + CASE WHEN id = %s THEN interval '1 hour' ELSE interval '-1 second' END
                WHERE id IN (%s, %s)""",
            (A, live, live, stale),
        )
        await aconn.commit()
        assert stale in await collect(signals.republished, stale, 15)
        reconciler = relay.reconciler
        assert reconciler is not None
        sweeps = reconciler.sweeps
        await wait_until_async(lambda: reconciler.sweeps >= sweeps + 3, 10, message="three more sweeps")
        assert relay.republished_total == 1  # the live run is left alone
    assert await fetch(aconn, "SELECT id, stream_id IS NOT NULL, publish_count FROM postbox.outbox ORDER BY id") == [
        (live, False, 1),
        (stale, True, 2),
    ]
