"""Helpers for the worker's integration and system tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection

import postbox
from postbox.settings import Settings
from postbox.worker import Worker, WorkerSignals
from tests.harness.tasks import worker as tasks_worker
from tests.harness.wait import take


def worker_settings(settings: Settings, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "queues": [tasks_worker.QUEUE],
        "visibility_timeout": 2.0,
        "heartbeat_interval": 0.5,
        "drain_timeout": 5.0,
        "retry_base_delay": 0.05,
        "retry_max_delay": 0.2,
        "concurrency": 10,
    }
    values.update(overrides)
    return settings.model_copy(update=values)


def all_signals() -> WorkerSignals:
    return WorkerSignals(
        claimed=asyncio.Queue(),
        started=asyncio.Queue(),
        finished=asyncio.Queue(),
        skipped=asyncio.Queue(),
        reclaimed=asyncio.Queue(),
        lost=asyncio.Queue(),
    )


@asynccontextmanager
async def running_worker(settings: Settings, **options: Any) -> AsyncIterator[Worker]:
    """A worker in this event loop (signals on); stopped and awaited on exit."""
    options.setdefault("signals", all_signals())
    worker = Worker(settings, **options)
    task = asyncio.create_task(worker.run())
    ready = asyncio.ensure_future(worker.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        ready.cancel()
        task.result()
    assert ready in done, "worker did not start"
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=30)


async def enqueue(aconn: AsyncConnection[Any], task: Any, args: dict[str, Any] | None = None, **kw: Any) -> int:
    """Enqueue one job and commit."""
    job_id = await postbox.enqueue_async(aconn, task, args, **kw)
    await aconn.commit()
    return job_id


async def finished(worker: Worker, count: int, within: float = 15.0) -> list[tuple[int, str]]:
    """The next ``count`` (job id, outcome) pairs the worker recorded."""
    return await take(worker.signals.finished, count, within, message="jobs finished")


async def fetch(aconn: AsyncConnection[Any], query: str, params: Any = None) -> list[tuple[Any, ...]]:
    cur = await aconn.execute(query, params)
    rows = await cur.fetchall()
    await aconn.commit()
    return rows


async def fetchval(aconn: AsyncConnection[Any], query: str, params: Any = None) -> Any:
    rows = await fetch(aconn, query, params)
    return rows[0][0] if rows else None


async def job_state(aconn: AsyncConnection[Any], job_id: int) -> str:
    return str(await fetchval(aconn, "SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)))
