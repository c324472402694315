"""Tasks of the hardening tests (issue 14): bad text, stuck sync handlers, poison jobs.

Importable by worker subprocesses (``--tasks tests.harness.tasks.hardening``); they share
the worker tests' queue.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from postbox import RetryPolicy, task
from tests.harness.tasks.worker import QUEUE

FAST = RetryPolicy(base_delay=0.05, max_delay=0.2, jitter=0.0)
# A file name that is not UTF-8, as os.listdir() returns it on Linux: a lone surrogate.
BAD_NAME = b"report-\xff.pdf".decode("utf-8", "surrogateescape")

# Released by in-process tests to let stuck sync handlers end.
RELEASE = threading.Event()


@task(queue=QUEUE, retry=FAST, max_attempts=2)
async def h_surrogate_error(ctx: Any) -> None:
    raise FileNotFoundError(BAD_NAME)


@task(queue=QUEUE, retry=FAST, max_attempts=1)
async def h_surrogate_error_last(ctx: Any) -> None:
    raise FileNotFoundError(2, "No such file or directory\x00", BAD_NAME)


@task(queue=QUEUE, retry=FAST, keep_result=True)
async def h_surrogate_result(ctx: Any) -> dict[str, Any]:
    return {"name": BAD_NAME, "nul": "a\x00b", BAD_NAME: [BAD_NAME]}


@task(queue=QUEUE, retry=FAST, max_attempts=1)
def h_sync_stuck(ctx: Any, seconds: float = 3600.0) -> None:
    """A sync handler that ignores everything (no ctx.cancelled check) until released."""
    RELEASE.wait(seconds)


@task(queue=QUEUE, retry=FAST, max_attempts=2, timeout=0.3)
def h_sync_timeout(ctx: Any) -> None:
    RELEASE.wait(3600.0)


@task(queue=QUEUE, retry=FAST, keep_result=True)
def h_sync_pid(ctx: Any) -> int:
    return os.getpid()


@task(queue=QUEUE, retry=FAST, max_attempts=3)
async def h_exit(ctx: Any) -> None:
    """Crashes its worker process (a poison job)."""
    os._exit(1)


@task(queue=QUEUE, retry=FAST, max_attempts=5)
def h_sync_sleep(ctx: Any, seconds: float) -> None:
    time.sleep(seconds)


RUNNING_NOW: list[int] = []  # job ids whose h_overlap handler runs now (in-process workers)
MOST_AT_ONCE: list[int] = [0]


@task(queue=QUEUE, retry=FAST, max_attempts=1)
async def h_overlap(ctx: Any) -> None:
    """Records how many of its kind run at once in this process."""
    import asyncio

    RUNNING_NOW.append(ctx.job_id)
    MOST_AT_ONCE[0] = max(MOST_AT_ONCE[0], len(RUNNING_NOW))
    await asyncio.sleep(0.1)
    RUNNING_NOW.remove(ctx.job_id)
