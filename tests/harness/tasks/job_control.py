"""Tasks of the job-control process tests (tests/system/test_job_control_processes.py).

Each records the arguments its run got in ``worker_effects`` (the DDL of
:mod:`tests.harness.tasks.worker`) inside ``ctx.transaction()``: exactly once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from postbox import debounce, throttle
from postbox.registry import RetryPolicy, task
from tests.harness.tasks.worker import _effect

QUEUE = "jctl"
FAST = RetryPolicy(base_delay=0.05, max_delay=0.2, jitter=0.0)
DEBOUNCE_WINDOW = 4.0


@task(queue=QUEUE, retry=FAST, unique=debounce(DEBOUNCE_WINDOW, by="doc"))
async def jc_debounced(ctx: Any, doc: str, version: int) -> None:
    await _effect(ctx, f"{doc}:v{version}")


@task(queue=QUEUE, retry=FAST, max_attempts=5, unique=debounce(1.0, by="doc"))
async def jc_debounced_slow(ctx: Any, doc: str, version: int, seconds: float = 0.0) -> None:
    """A debounced task that takes its time (a worker can be killed mid-run)."""
    await asyncio.sleep(seconds)
    await _effect(ctx, f"{doc}:v{version}")


@task(queue=QUEUE, retry=FAST, unique=debounce(60, by="doc", merge=True))
async def jc_merged(ctx: Any, doc: str, **fields: Any) -> None:
    await _effect(ctx, doc)


@task(queue=QUEUE, retry=FAST, unique=throttle(60, by="user"))
async def jc_throttled(ctx: Any, user: int, text: str = "") -> None:
    await _effect(ctx, f"{user}:{text}")


@task(queue=QUEUE, retry=FAST, max_attempts=5, encrypted=True)
async def jc_secret(ctx: Any, card: str, n: int = 0, seconds: float = 0.0) -> None:
    """An encrypted task that takes its time (a worker can be killed mid-run)."""
    await asyncio.sleep(seconds)
    await _effect(ctx, f"card:{card}:{n}")


@task(queue=QUEUE, retry=FAST, max_attempts=5)
async def jc_slow(ctx: Any, label: str, seconds: float = 0.0) -> None:
    await asyncio.sleep(seconds)
    await _effect(ctx, label)


@task(queue=QUEUE, retry=FAST, encrypted=True, keep_result=True)
async def jc_secret_result(ctx: Any, card: str, n: int = 0) -> dict[str, Any]:
    """An encrypted task whose kept result holds the secret too (sealed by the worker)."""
    return {"card": card, "n": n}
