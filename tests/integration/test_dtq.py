"""The dtq demo tasks (examples/dtq), run inline in one open transaction on a real database."""

from __future__ import annotations

from typing import Any

import psycopg

from postbox import enqueue_async
from postbox.testing import run_enqueued
from postbox_examples import dtq
from postbox_examples.dtq import schema as dtq_schema


async def test_each_demo_task_ends_as_its_docstring_says(
    database_url: str, aconn: psycopg.AsyncConnection[Any]
) -> None:
    dtq_schema.migrate(database_url)
    ids = {
        "echo": await enqueue_async(aconn, dtq.echo, {"message": "hi"}),
        "sleep": await enqueue_async(aconn, dtq.sleep, {"seconds": 0.05}),
        "fibonacci": await enqueue_async(aconn, dtq.fibonacci, {"n": 20}),
        "flaky": await enqueue_async(aconn, dtq.flaky, {"failures": 2}),
        "always_fail": await enqueue_async(aconn, dtq.always_fail, {}),
        "slow": await enqueue_async(aconn, dtq.slow, {"seconds": 0.1, "steps": 2}),
        "too_long": await enqueue_async(aconn, dtq.sleep, {"seconds": 31}),
    }
    runs = await run_enqueued(aconn)
    by_job: dict[int, list[tuple[int, str]]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append((run.attempt, run.state))
    assert by_job[ids["echo"]] == [(1, "succeeded")]
    assert by_job[ids["sleep"]] == [(1, "succeeded")]
    assert by_job[ids["fibonacci"]] == [(1, "succeeded")]
    assert by_job[ids["slow"]] == [(1, "succeeded")]
    assert by_job[ids["flaky"]] == [(1, "retrying"), (2, "retrying"), (3, "succeeded")]
    assert by_job[ids["always_fail"]] == [(1, "retrying"), (2, "retrying"), (3, "dead")]
    assert by_job[ids["too_long"]][-1][1] == "dead"  # a bad argument fails every attempt, then dead-letters
    results = {run.job_id: run.result for run in runs if run.state == "succeeded"}
    assert results[ids["echo"]] == "hi" and results[ids["fibonacci"]] == 6765 and results[ids["flaky"]] == 3
    await aconn.rollback()


async def test_counter_counts_each_job_once(database_url: str, aconn: psycopg.AsyncConnection[Any]) -> None:
    dtq_schema.migrate(database_url)
    for _ in range(3):
        await enqueue_async(aconn, dtq.counter, {"name": "visits"})
    await enqueue_async(aconn, dtq.counter, {"name": "other"})
    runs = await run_enqueued(aconn, dtq.counter)
    assert sorted(run.state for run in runs) == ["succeeded"] * 4
    cur = await aconn.execute("SELECT name, value FROM dtq.counters ORDER BY name")
    assert await cur.fetchall() == [("other", 1), ("visits", 3)]
    cur = await aconn.execute(
        "SELECT count(*) FROM postbox.processed_jobs WHERE outbox_id = ANY(%s)", ([run.job_id for run in runs],)
    )
    assert await cur.fetchone() == (4,)  # the job id as the key: one processed row per job
    await aconn.rollback()
