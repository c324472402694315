"""Flow control on real PostgreSQL and Redis, workers in this process, the real relay.

Every held-back job goes back through the relay; the handlers record their run
intervals in ``flow_runs`` (tests/harness/tasks/flow.py), from which overlaps and start
rates are computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

import postbox
from postbox.relay import Relay
from postbox.settings import Settings
from tests.harness.tasks import flow as f
from tests.harness.wait import wait_until_async
from tests.harness.worker import fetch, fetchval, running_worker, worker_settings


@pytest.fixture
async def fsettings(settings: Settings) -> Settings:
    return worker_settings(settings, queues=[f.QUEUE])


@pytest.fixture
async def runs(aconn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    await aconn.execute(f.RUNS_DDL)
    await aconn.commit()
    return aconn


@contextlib.asynccontextmanager
async def relay_running(settings: Settings) -> AsyncIterator[Relay]:
    relay = Relay(settings)
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 10)


async def enqueue_many(aconn: psycopg.AsyncConnection[Any], items: list[tuple[Any, dict[str, Any]]]) -> list[int]:
    ids = [await postbox.enqueue_async(aconn, task, args) for task, args in items]
    await aconn.commit()
    return ids


async def all_done(aconn: psycopg.AsyncConnection[Any], count: int) -> bool:
    return await fetchval(aconn, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == count


async def intervals(aconn: psycopg.AsyncConnection[Any], task: str) -> list[tuple[float, float]]:
    rows = await fetch(aconn, "SELECT started, ended FROM flow_runs WHERE task = %s ORDER BY started", (task,))
    return [(s, e) for s, e in rows]


async def test_a_global_concurrency_limit_holds_across_workers_and_spends_no_attempt(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    aconn = runs
    await enqueue_many(aconn, [(f.f_conc, {"seconds": 0.1}) for _ in range(30)])
    async with relay_running(fsettings), running_worker(fsettings) as w1, running_worker(fsettings) as w2:
        await wait_until_async(lambda: all_done(aconn, 30), 60, message="30 limited jobs done")
        held = w1.metrics.jobs._values.get((f.QUEUE, "f_conc", "held"), 0)
        held += w2.metrics.jobs._values.get((f.QUEUE, "f_conc", "held"), 0)
    assert f.max_overlap(await intervals(aconn, "f_conc")) <= 3
    assert held > 0  # the limit did hold jobs back (two workers with 10 slots each)
    assert await fetch(aconn, "SELECT DISTINCT attempts FROM postbox.outbox") == [(1,)]
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.limit_slots") == 0  # released after the outcomes


async def test_partitions_never_overlap_within_a_key_and_run_side_by_side_across_keys(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    aconn = runs
    await enqueue_many(aconn, [(f.f_part, {"customer_id": c, "seconds": 0.05}) for _ in range(3) for c in range(20)])
    async with relay_running(fsettings), running_worker(fsettings, worker_id="w-a"), running_worker(fsettings):
        await wait_until_async(lambda: all_done(aconn, 60), 60, message="60 partitioned jobs done")
    rows = await fetch(aconn, "SELECT part, started, ended FROM flow_runs")
    by_part: dict[str, list[tuple[float, float]]] = {}
    for part, started, ended in rows:
        by_part.setdefault(part, []).append((started, ended))
    assert len(by_part) == 20 and all(len(v) == 3 for v in by_part.values())
    assert max(f.max_overlap(v) for v in by_part.values()) == 1
    assert f.max_overlap([iv for v in by_part.values() for iv in v]) > 1  # other keys did run at once


async def test_a_rate_limit_spaces_starts_across_workers(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    aconn = runs
    await enqueue_many(aconn, [(f.f_rate, {}) for _ in range(100)])
    async with relay_running(fsettings), running_worker(fsettings), running_worker(fsettings):
        await wait_until_async(lambda: all_done(aconn, 100), 60, message="100 rate-limited jobs done")
    starts = [s for s, _ in await intervals(aconn, "f_rate")]
    span = starts[-1] - starts[0]
    assert span >= 99 / 50 * 0.9  # 100 starts at 50/s take about 2 s
    # No second holds more than 50 starts, give or take the start cell's slack: a start may
    # come half an interval ahead of it and the cell keeps its schedule through one interval
    # of lateness (docs/flow-control.md): at most 2.5 more, plus one at the window's edge.
    assert max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts) <= 53


async def test_an_unlimited_task_is_not_blocked_behind_a_limited_one(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    aconn = runs
    await enqueue_many(aconn, [(f.f_conc, {"seconds": 1.0}) for _ in range(30)])  # 10 s at 3 at once
    await enqueue_many(aconn, [(f.f_free, {}) for _ in range(200)])
    async with relay_running(fsettings), running_worker(fsettings):
        await wait_until_async(
            lambda: fetchval(aconn, "SELECT count(*) = 200 FROM flow_runs WHERE task = 'f_free'"),
            30,
            message="the unlimited jobs done",
        )
        limited_done = await fetchval(aconn, "SELECT count(*) FROM flow_runs WHERE task = 'f_conc'")
    assert limited_done < 30  # the unlimited ones finished while the limited ones still waited


async def test_an_override_changes_the_limit_without_a_restart(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    aconn = runs
    async with relay_running(fsettings), running_worker(fsettings) as worker:
        assert worker.limits.tasks["f_conc"].concurrency == 3
        await aconn.execute(
            "UPDATE postbox.limits SET override = '{\"concurrency\": 1}' WHERE scope = 'task' AND name = 'f_conc'"
        )
        await aconn.commit()
        await wait_until_async(lambda: worker.limits.tasks["f_conc"].concurrency == 1, 10, message="override applied")
        await enqueue_many(aconn, [(f.f_conc, {"seconds": 0.05}) for _ in range(10)])
        await wait_until_async(lambda: all_done(aconn, 10), 60, message="10 jobs done")
    assert f.max_overlap(await intervals(aconn, "f_conc")) == 1


def test_prune_removes_flow_state_that_no_longer_counts_and_keeps_live_slots(
    conn: psycopg.Connection[Any], settings: Settings
) -> None:
    from postbox import retention

    live, dead = conn.execute(
        "INSERT INTO postbox.outbox (queue, task, state, attempts, claimed_by, lease_until)"
        " VALUES ('ftest', 'f_conc', 'running', 1, 'w', now() + interval '1 minute'),"
        "        ('ftest', 'f_conc', 'succeeded', 1, NULL, NULL) RETURNING id"
    ).fetchall()
    conn.execute(
        "INSERT INTO postbox.limit_slots (key, job_id, attempt) VALUES ('task:f_conc', %s, 1), ('task:f_conc', %s, 1)",
        (live[0], dead[0]),
    )
    conn.execute(
        "INSERT INTO postbox.limit_rates (key, tat, start_tat) VALUES"
        " ('task:old', now() - interval '1 hour', now() - interval '2 hours'),"
        " ('task:busy', now() - interval '1 hour', now() + interval '5 seconds')"
    )
    conn.commit()
    assert retention.prune(conn, settings, dry_run=True).limits == 2
    report = retention.prune(conn, settings)
    assert report.limits == 2
    assert conn.execute("SELECT job_id FROM postbox.limit_slots").fetchall() == [(live[0],)]
    assert conn.execute("SELECT key FROM postbox.limit_rates").fetchall() == [("task:busy",)]


async def test_a_queue_limit_holds_for_every_task_of_the_queue(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    """limit_queue()/an override on the queue: concurrency and rate across all its tasks."""
    aconn = runs
    await aconn.execute(
        "INSERT INTO postbox.limits (scope, name, override, override_by, override_at)"
        ' VALUES (\'queue\', %s, \'{"concurrency": 2, "rate": {"limit": 40, "period": 1.0, "burst": 1}}\','
        " 'test', now())",
        (f.QUEUE,),
    )
    await aconn.commit()
    await enqueue_many(aconn, [(f.f_free, {}) for _ in range(30)] + [(f.f_part, {"customer_id": i}) for i in range(30)])
    async with relay_running(fsettings), running_worker(fsettings) as w1, running_worker(fsettings):
        assert w1.limits.queues[f.QUEUE].concurrency == 2
        await wait_until_async(lambda: all_done(aconn, 60), 60, message="60 jobs of two tasks done")
    rows = await fetch(aconn, "SELECT started, ended FROM flow_runs ORDER BY started")
    assert len(rows) == 60
    assert f.max_overlap([(s, e) for s, e in rows]) <= 2  # both tasks together
    starts = [s for s, _ in rows]
    assert starts[-1] - starts[0] >= 59 / 40 * 0.9  # 60 starts at 40/s take about 1.5 s


async def test_a_worker_stops_at_once_while_a_job_waits_in_it_for_its_reservation(
    fsettings: Settings, runs: psycopg.AsyncConnection[Any]
) -> None:
    """The reservation (4 s away) waits in the worker; stopping leaves its entry to another worker."""
    aconn = runs
    await enqueue_many(aconn, [(f.f_slow_rate, {}) for _ in range(2)])
    async with relay_running(fsettings):
        async with running_worker(fsettings) as worker:
            await wait_until_async(
                lambda: fetchval(aconn, "SELECT count(*) = 1 FROM flow_runs"), 30, message="the first start"
            )
            await wait_until_async(lambda: len(worker.flow_waits) == 1, 30, message="the second waiting in the worker")
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 2.0  # not the 4 s to its reservation
        async with running_worker(fsettings):  # the entry left pending is reclaimed, its token kept
            await wait_until_async(
                lambda: fetchval(aconn, "SELECT count(*) = 2 FROM flow_runs"), 30, message="the second start"
            )
    gap = await fetchval(aconn, "SELECT max(started) - min(started) FROM flow_runs")
    assert gap >= 4.0 * 0.9
