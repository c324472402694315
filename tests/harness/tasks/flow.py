"""Tasks under flow-control limits (importable by worker subprocesses: ``--tasks tests.harness.tasks.flow``).

Each run records its start and end (wall clock) in ``flow_runs``, inside
``ctx.transaction()``: one row per job, so overlaps and start rates can be
computed from PostgreSQL afterwards, whichever process ran the job.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from postbox import RetryPolicy, task

QUEUE = "ftest"
FAST = RetryPolicy(base_delay=0.05, max_delay=0.2, jitter=0.0)

RUNS_DDL = """
CREATE TABLE IF NOT EXISTS flow_runs (
    job_id     bigint PRIMARY KEY,
    task       text   NOT NULL,
    part       text,
    worker_id  text   NOT NULL,
    attempt    int    NOT NULL,
    started    double precision NOT NULL,
    ended      double precision NOT NULL
);
"""


async def _run(ctx: Any, task_name: str, part: str | None, seconds: float) -> None:
    started = time.time()
    if seconds:
        await asyncio.sleep(seconds)
    ended = time.time()
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO flow_runs (job_id, task, part, worker_id, attempt, started, ended)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (ctx.job_id, task_name, part, ctx.worker_id, ctx.attempt, started, ended),
        )


@task(queue=QUEUE, retry=FAST, concurrency=3)
async def f_conc(ctx: Any, seconds: float = 0.1) -> None:
    await _run(ctx, "f_conc", None, seconds)


@task(queue=QUEUE, retry=FAST, rate="50/s")
async def f_rate(ctx: Any) -> None:
    await _run(ctx, "f_rate", None, 0)


@task(queue=QUEUE, retry=FAST, concurrency=1, partition_by="customer_id")
async def f_part(ctx: Any, customer_id: int, seconds: float = 0.05) -> None:
    await _run(ctx, "f_part", str(customer_id), seconds)


@task(queue=QUEUE, retry=FAST)
async def f_free(ctx: Any) -> None:
    await _run(ctx, "f_free", None, 0)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at t closes before a start at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


@task(queue=QUEUE, retry=FAST, rate="1/4s")
async def f_slow_rate(ctx: Any) -> None:
    await _run(ctx, "f_slow_rate", None, 0)
