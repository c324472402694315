"""Tasks of the high-availability system tests (``--tasks tests.harness.tasks.ha``).

``ha_effect`` writes one row to ``ha_effects`` inside ``ctx.transaction()``:
the effect commits with the job's outcome, so a job that ran twice would show
two rows. A short pause keeps jobs in flight when a server goes away.
"""

from __future__ import annotations

import asyncio
from typing import Any

from postbox import RetryPolicy, task

QUEUE = "ha"
FAST = RetryPolicy(base_delay=0.1, max_delay=1.0, jitter=0.0)

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS public.ha_effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint NOT NULL,
    attempt    int    NOT NULL,
    worker_id  text   NOT NULL
)
"""


@task(queue=QUEUE, retry=FAST, max_attempts=10)
async def ha_effect(ctx: Any, n: int) -> None:
    await asyncio.sleep(0.02)
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO public.ha_effects (job_id, attempt, worker_id) VALUES (%s, %s, %s)",
            (ctx.job_id, ctx.attempt, ctx.worker_id),
        )
