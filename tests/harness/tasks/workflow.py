"""Tasks the workflow tests run (importable by worker subprocesses: ``--tasks tests.harness.tasks.workflow``).

Every run that counts writes one row to ``wf_log`` (see ``LOG_DDL``) inside its
``ctx.transaction()``, with what it read of its upstream jobs: a row there is an
effect committed exactly once, together with the job's success and the release
of its dependents.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from postbox import PermanentError, RetryPolicy, task

QUEUE = "wtest"
FAST = RetryPolicy(base_delay=0.05, max_delay=0.2, jitter=0.0)

LOG_DDL = """
CREATE TABLE IF NOT EXISTS wf_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   bigint NOT NULL,
    label    text   NOT NULL,
    attempt  int    NOT NULL,
    upstream jsonb  NOT NULL DEFAULT '{}'::jsonb,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


async def _log(ctx: Any, label: str, upstream: dict[str, Any] | None = None) -> None:
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO wf_log (job_id, label, attempt, upstream) VALUES (%s, %s, %s, %s::jsonb)",
            (ctx.job_id, label, ctx.attempt, orjson.dumps(upstream or {}).decode()),
        )


@task(queue=QUEUE, retry=FAST, keep_result=True)
async def wf_step(ctx: Any, label: str) -> str:
    """One effect in ctx.transaction(); returns its label (kept: written after the commit)."""
    await _log(ctx, label)
    return label


@task(queue=QUEUE, retry=FAST, keep_result=True)
async def wf_plain(ctx: Any, label: str) -> str:
    """No transaction of its own: its success (and the release) is the worker's outcome batch."""
    return label


@task(queue=QUEUE, retry=FAST, keep_result=True)
async def wf_collect(ctx: Any, label: str) -> int:
    """Read the upstream jobs, log what was seen; returns how many succeeded."""
    up = await ctx.upstream()
    seen = {
        "results": sorted(str(r) for r in up.results()),
        "states": sorted(job.state for job in up.jobs),
        "failures": sorted(str((job.failure or {}).get("state")) for job in up.failures()),
        # str(): a result is None when its job's worker died between the commit and writing it
        "steps": sorted(str(r) for r in up.results(wf_step)),
    }
    await _log(ctx, label, seen)
    return len(up.results())


@task(queue=QUEUE, retry=FAST, max_attempts=2)
async def wf_fail(ctx: Any, label: str) -> None:
    raise PermanentError(f"{label} failed")


@task(queue=QUEUE, retry=FAST, max_attempts=3)
async def wf_rollback_once(ctx: Any, label: str) -> None:
    """Attempt 1 writes its effect, then fails inside its transaction (all rolled back); attempt 2 commits."""
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO wf_log (job_id, label, attempt) VALUES (%s, %s, %s)", (ctx.job_id, label, ctx.attempt)
        )
        if ctx.attempt == 1:
            raise RuntimeError("rolled back")


@task(queue=QUEUE, retry=FAST, max_attempts=5)
async def wf_slow(ctx: Any, label: str, seconds: float) -> None:
    await asyncio.sleep(seconds)
    await _log(ctx, label)
