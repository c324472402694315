"""Helpers for the worker's integration and system tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

import postbox
from postbox.redis_conn import AnyRedis
from postbox.settings import Settings
from postbox.worker import Worker, WorkerSignals
from postbox.worker.completer import Completer, Finished
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


async def running_jobs(aconn: AsyncConnection[Any], task: Any, count: int) -> list[int]:
    """``count`` jobs of ``task``, enqueued and set running under ``worker-test`` as its claim would: committed."""
    ids = [await enqueue(aconn, task) for _ in range(count)]
    await aconn.execute(
        "UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = 'worker-test',"
        " lease_until = now() + interval '1 minute' WHERE id = ANY(%s)",
        (ids,),
    )
    await aconn.commit()
    return ids


def completer_of_worker_test(
    pool: AsyncConnectionPool[Any],
    redis: AnyRedis,
    settings: Settings,
    on_done: Callable[[list[Finished]], None],
    **options: Any,
) -> Completer:
    """A completer writing outcomes as ``worker-test``, the owner :func:`running_jobs` gives its rows."""
    return Completer(
        pool=pool,
        redis=redis,
        prefix=settings.redis_prefix,
        worker_id="worker-test",
        result_ttl=lambda job: 60.0,
        on_done=on_done,
        **options,
    )


@asynccontextmanager
async def small_pool(settings: Settings) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """An autocommit pool of two connections to the test database, as a worker's parts use."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        settings.require_database_url(), min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


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
