"""Tasks the worker tests run (importable by worker subprocesses: ``--tasks tests.harness.tasks.worker``).

Effects that must be counted go to the ``worker_effects`` table (see
``EFFECTS_DDL``), written inside ``ctx.transaction()`` so they are exactly once.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from postbox import JobCancelled, PermanentError, RetryLater, RetryPolicy, Snooze, debounce, task

QUEUE = "wtest"
FAST = RetryPolicy(base_delay=0.05, max_delay=0.2, jitter=0.0)

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS worker_effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint NOT NULL,
    label      text   NOT NULL,
    attempt    int    NOT NULL,
    worker_id  text   NOT NULL
);
CREATE TABLE IF NOT EXISTS worker_counter (name text PRIMARY KEY, value bigint NOT NULL);
INSERT INTO worker_counter VALUES ('hits', 0) ON CONFLICT DO NOTHING;
"""

# In-process observations (only meaningful for a worker inside the test process).
STARTED: list[tuple[int, str]] = []


async def _effect(ctx: Any, label: str) -> None:
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO worker_effects (job_id, label, attempt, worker_id) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, label, ctx.attempt, ctx.worker_id),
        )


@task(queue=QUEUE, retry=FAST)
async def w_noop(ctx: Any) -> None:
    return None


@task(queue=QUEUE, retry=FAST)
async def w_record(ctx: Any, label: str) -> None:
    """Remember the start order (priority test)."""
    STARTED.append((ctx.job_id, label))


@task(queue=QUEUE, retry=FAST)
async def w_count(ctx: Any) -> None:
    async with ctx.transaction() as conn:
        await conn.execute("UPDATE worker_counter SET value = value + 1 WHERE name = 'hits'")


@task(queue=QUEUE, retry=FAST, keep_result=True)
async def w_add(ctx: Any, a: int, b: int) -> int:
    return a + b


@task(queue=QUEUE, retry=FAST, keep_result=True)
def w_sync_add(ctx: Any, a: int, b: int) -> dict[str, int]:
    return {"sum": a + b, "thread": 1}


@task(queue=QUEUE, retry=FAST, max_attempts=5, keep_result=True)
async def w_flaky(ctx: Any, fail_times: int) -> str:
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    await _effect(ctx, "flaky")
    return f"ok on attempt {ctx.attempt}"


@task(queue=QUEUE, retry=FAST, max_attempts=3)
async def w_always_fails(ctx: Any) -> None:
    raise ValueError("boom\nsecond line " + "x" * 1000)


@task(queue=QUEUE, retry=FAST, max_attempts=5)
async def w_permanent(ctx: Any) -> None:
    raise PermanentError("card declined")


@task(queue=QUEUE, retry=FAST, max_attempts=3)
async def w_retry_later(ctx: Any, seconds: float) -> None:
    if ctx.attempt == 1:
        raise RetryLater(seconds)
    await _effect(ctx, "retry_later")


@task(queue=QUEUE, retry=FAST, max_attempts=2, max_snoozes=2)
async def w_snooze(ctx: Any, times: int, seconds: float = 0.05, returned: bool = False) -> Snooze | None:
    """Snooze on the first ``times`` runs (raised, or ``returned``), then record one effect."""
    if ctx.attempt <= times:
        snooze = Snooze(seconds, f"not yet ({ctx.attempt})")
        if returned:
            return snooze
        raise snooze
    await _effect(ctx, "snooze")
    return None


@task(queue=QUEUE, retry=FAST)
async def w_progress(ctx: Any, steps: int, pause: float) -> None:
    """Report progress on every step of a loop (far more often than it is written)."""
    for step in range(1, steps + 1):
        ctx.progress(step, steps, f"step {step}")
        await asyncio.sleep(pause)


@task(queue=QUEUE, retry=FAST)
def w_sync_progress(ctx: Any, steps: int) -> None:
    """The same from a sync handler's thread, total unknown; the last value right before returning."""
    for step in range(1, steps + 1):
        ctx.progress(step)
        time.sleep(0.001)


@task(queue=QUEUE, retry=FAST, unique=debounce(5, by="doc"))
async def w_debounced(ctx: Any, doc: str, version: int) -> None:
    """Record the arguments the run got (debounce: the last enqueued for the key)."""
    await _effect(ctx, f"{doc}:v{version}")


@task(queue=QUEUE, retry=FAST, encrypted=True)
async def w_secret(ctx: Any, card: str, n: int = 0) -> None:
    """An encrypted task: records what it received (the worker opened the args)."""
    await _effect(ctx, f"card:{card}:{n}")


@task(queue=QUEUE, retry=FAST, timeout=0.2, max_attempts=2)
async def w_too_slow(ctx: Any) -> None:
    await asyncio.sleep(5)


@task(queue=QUEUE, retry=FAST, max_attempts=5)
async def w_slow_effect(ctx: Any, seconds: float, label: str = "slow") -> None:
    """Sleep, then record one effect in ctx.transaction() (signal tests)."""
    await asyncio.sleep(seconds)
    await _effect(ctx, label)


@task(queue=QUEUE, retry=FAST, max_attempts=5)
def w_sync_slow_effect(ctx: Any, seconds: float) -> None:
    time.sleep(seconds)


@task(queue=QUEUE, retry=FAST, max_attempts=3)
async def w_poison(ctx: Any) -> None:
    os._exit(1)


@task(queue=QUEUE, retry=FAST)
async def w_wait_cancel(ctx: Any) -> None:
    """Runs until cancelled (cooperatively checks ctx.cancelled)."""
    for _ in range(3000):
        if ctx.cancelled:
            raise JobCancelled()
        await asyncio.sleep(0.02)
    raise RuntimeError("never cancelled")


@task(queue=QUEUE, retry=FAST)
async def w_enqueue_child(ctx: Any, n: int) -> None:
    async with ctx.transaction():
        for i in range(n):
            await ctx.enqueue(w_add, {"a": i, "b": 1})


@task(queue=QUEUE, retry=FAST)
async def w_tx_noop(ctx: Any) -> None:
    async with ctx.transaction():
        pass


@task(queue=QUEUE, retry=FAST)
async def w_slow_in_transaction(ctx: Any, seconds: float) -> None:
    """Work ``seconds`` inside the job's transaction (its success is stamped when it commits)."""
    async with ctx.transaction():
        await asyncio.sleep(seconds)


# w_held_in_transaction's jobs inside their transaction now, and what lets them out (a test sets it).
held_inside: set[int] = set()
held_release: asyncio.Event | None = None


@task(queue=QUEUE, retry=FAST)
async def w_held_in_transaction(ctx: Any) -> None:
    """Hold the job's transaction open until the test sets ``held_release``."""
    async with ctx.transaction():
        held_inside.add(ctx.job_id)
        try:
            assert held_release is not None, "the test sets held_release first"
            await held_release.wait()
        finally:
            held_inside.discard(ctx.job_id)
