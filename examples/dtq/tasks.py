"""The dtq demo tasks: enqueue them from the CLI or the API and watch what postbox does.

==============  ==========================================================================
``echo``        returns its ``message`` (kept as the job's result)
``sleep``       sleeps ``seconds`` (at most 30), cooperatively cancellable
``fibonacci``   computes F(``n``) the slow way: CPU-bound, so a sync handler (a worker thread)
``flaky``       fails its first ``failures`` attempts, then succeeds (retries with backoff)
``always_fail`` fails every attempt and ends in the dead letters after ``max_attempts``
``counter``     adds one to ``dtq.counters[name]`` through ``ctx.transaction()``: exactly once
                per job, however often it is delivered
``slow``        works ``seconds`` (at most 30) in steps, logging each, to watch in the dashboard
==============  ==========================================================================

``counter`` needs its table: ``stagedoor migrate`` creates it.
"""

from __future__ import annotations

import asyncio

from postbox.context import JobContext
from postbox.registry import task

QUEUE = "dtq"
MAX_SECONDS = 30.0


class DemoFailure(Exception):
    """What ``flaky`` and ``always_fail`` raise: an ordinary, retryable error."""


@task(queue=QUEUE, keep_result=True)
async def echo(ctx: JobContext, message: str = "hello") -> str:
    """Return ``message``: the job's result (``postbox jobs get`` shows it)."""
    return message


@task(queue=QUEUE)
async def sleep(ctx: JobContext, seconds: float = 1.0) -> None:
    """Sleep ``seconds`` (0–30); stop early when an operator cancels the job."""
    if not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f"sleep: seconds must be between 0 and {MAX_SECONDS:g}, got {seconds}")
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    for _ in range(int(seconds * 10) + 1):  # tenths of a second, checking for a cancel between them
        if ctx.cancelled or loop.time() >= end:
            return
        await asyncio.sleep(min(0.1, end - loop.time()))


def _fib(n: int) -> int:
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


@task(queue=QUEUE, keep_result=True, timeout=120)
def fibonacci(ctx: JobContext, n: int = 25) -> int:
    """F(``n``), recursively (0–32). CPU-bound: a sync handler, run on the worker's threads."""
    if not 0 <= n <= 32:
        raise ValueError(f"fibonacci: n must be between 0 and 32, got {n}")
    return _fib(n)


@task(queue=QUEUE, max_attempts=10, keep_result=True)
async def flaky(ctx: JobContext, failures: int = 2) -> int:
    """Fail the first ``failures`` attempts, then succeed; returns the attempt that succeeded."""
    if ctx.attempt <= failures:
        raise DemoFailure(f"flaky: attempt {ctx.attempt} of the {failures} that fail")
    return ctx.attempt


@task(queue=QUEUE, max_attempts=3)
async def always_fail(ctx: JobContext, reason: str = "always fails") -> None:
    """Fail every attempt: the job ends in the dead letters (``postbox dlq list``)."""
    raise DemoFailure(reason)


@task(queue=QUEUE)
async def counter(ctx: JobContext, name: str = "default") -> None:
    """Add one to ``dtq.counters[name]``, exactly once per job (the job id as the key)."""
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO dtq.counters (name, value) VALUES (%s, 1)"
            " ON CONFLICT (name) DO UPDATE SET value = dtq.counters.value + 1",
            (name,),
        )


@task(queue=QUEUE, timeout=60)
async def slow(ctx: JobContext, seconds: float = 10.0, steps: int = 10) -> None:
    """Work ``seconds`` (0–30) in ``steps`` steps, logging each."""
    if not 0 <= seconds <= MAX_SECONDS or steps < 1:
        raise ValueError(f"slow: seconds must be between 0 and {MAX_SECONDS:g} and steps >= 1")
    for step in range(1, steps + 1):
        if ctx.cancelled:
            return
        await asyncio.sleep(seconds / steps)
        ctx.log.info("slow: step %d of %d", step, steps)
