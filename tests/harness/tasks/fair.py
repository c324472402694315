"""A task of a fair queue (importable by worker subprocesses: ``--tasks tests.harness.tasks.fair``).

Each run records its job, tenant, attempt and start (wall clock) in ``fair_runs``
inside ``ctx.transaction()``: the table has no key on the job, so a job whose
effect committed twice would show two rows.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from postbox import RetryPolicy, task

QUEUE = "fairtest"
FAST = RetryPolicy(base_delay=0.05, max_delay=0.2, jitter=0.0)

RUNS_DDL = """
CREATE TABLE IF NOT EXISTS fair_runs (
    job_id    bigint NOT NULL,
    tenant_id text   NOT NULL,
    attempt   int    NOT NULL,
    started   double precision NOT NULL
);
"""


@task(queue=QUEUE, retry=FAST, max_attempts=5)
async def fair_job(ctx: Any, tenant_id: str, seconds: float = 0.0) -> None:
    started = time.time()
    if seconds:
        await asyncio.sleep(seconds)
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO fair_runs (job_id, tenant_id, attempt, started) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, tenant_id, ctx.attempt, started),
        )
