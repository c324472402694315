"""A worker whose start-up writes meet a busy or vanished database retries them instead of exiting.

The same for Redis: a worker starting while Redis restarts (or a cluster settles a failover) waits
for it. Seen in whole-suite runs: a worker starting while another held a limit row past its
lock timeout, or while PostgreSQL crashed and a standby was promoted, died with the
error and never served. Here another session holds the workers table locked past the
worker's lock timeout: the start-up heartbeat times out, is retried, and the worker
starts once the lock is gone.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from postbox.streams import GROUP, all_streams
from postbox.worker import Worker
from tests.harness.redis_server import RedisServer
from tests.harness.wait import wait_until_async
from tests.harness.worker import worker_settings


async def _retrying(
    task: asyncio.Task[None], worker: Worker, caplog: pytest.LogCaptureFixture, what: str, message: str
) -> None:
    """Wait until the starting worker logs that ``what`` is unavailable; it must be waiting, not done or ready."""
    await wait_until_async(
        lambda: any(f"{what} unavailable while starting" in r.getMessage() for r in caplog.records) or task.done(),
        30,
        message=message,
    )
    assert not task.done(), task.exception() if task.done() else None
    assert not worker.ready.is_set()


async def test_a_start_up_write_that_times_out_on_a_lock_is_retried(
    settings: Settings, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="postbox.worker.worker")
    # visibility 1 s: the worker's sessions wait at most 2 s for a lock (postbox.db.worker_bounds)
    worker = Worker(worker_settings(settings, visibility_timeout=1.0, heartbeat_interval=0.25))
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE postbox.workers IN ACCESS EXCLUSIVE MODE")  # held until the commit below
        task = asyncio.create_task(worker.run())
        try:
            await _retrying(task, worker, caplog, "database", "the start-up heartbeat timing out on the lock")
            blocker.commit()
            await asyncio.wait_for(worker.ready.wait(), 30)
            with psycopg.connect(database_url) as conn:
                rows = conn.execute("SELECT count(*) FROM postbox.workers WHERE id = %s", (worker.id,)).fetchone()
            assert rows == (1,)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)


async def test_the_schema_revision_check_that_times_out_on_a_lock_is_retried(
    settings: Settings, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The first statement a worker sends, the check of the database's schema revision, retried as the
    writes after it are (a primary crashing then ended the worker before it served)."""
    caplog.set_level(logging.WARNING, logger="postbox.worker.worker")
    worker = Worker(worker_settings(settings, visibility_timeout=1.0, heartbeat_interval=0.25))
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE postbox.alembic_version IN ACCESS EXCLUSIVE MODE")  # until the commit below
        task = asyncio.create_task(worker.run())
        try:
            await _retrying(task, worker, caplog, "database", "the revision check timing out on the lock")
            blocker.commit()
            await asyncio.wait_for(worker.ready.wait(), 30)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)


async def test_a_worker_starting_while_redis_is_down_waits_for_it(
    settings: Settings, private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis restarting (or a cluster still settling a failover: CLUSTERDOWN) when a worker starts: its
    consumer groups are created once Redis answers, instead of the worker exiting."""
    caplog.set_level(logging.WARNING, logger="postbox.worker.worker")
    private_redis.stop()
    worker = Worker(worker_settings(settings.model_copy(update={"redis_url": private_redis.url})))
    task = asyncio.create_task(worker.run())
    try:
        await _retrying(task, worker, caplog, "Redis", "the start-up's consumer groups failing on the stopped Redis")
        private_redis.start()
        await asyncio.wait_for(worker.ready.wait(), 30)
        client = aioredis.Redis.from_url(private_redis.url)
        try:
            streams = all_streams(settings.redis_prefix, worker.queues)
            groups = [await client.xinfo_groups(key) for key in streams]
        finally:
            await client.aclose()
        assert all([g["name"] for g in found] == [GROUP.encode()] for found in groups)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
