"""A worker run in-process (``Worker.run()``) on a database migrated less far than its code."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from postbox import migrate, revision
from postbox.errors import SchemaOutdatedError
from postbox.settings import Settings
from postbox.worker import Worker
from tests.harness.worker import running_worker, worker_settings


async def test_worker_run_refuses_an_older_schema_and_writes_nothing(
    settings: Settings, empty_database_url: str
) -> None:
    migrate.upgrade(empty_database_url, "0005_fenced_success")
    at_newest = worker_settings(settings.model_copy(update={"database_url": empty_database_url}))
    worker = Worker(at_newest)
    refusal = f"at revision 0005_fenced_success; this postbox needs {revision.REQUIRED}"
    with pytest.raises(SchemaOutdatedError, match=refusal):
        await asyncio.wait_for(worker.run(), timeout=60)
    with psycopg.connect(empty_database_url) as conn:
        written = conn.execute(
            "SELECT (SELECT count(*) FROM postbox.workers), (SELECT count(*) FROM postbox.tasks)"
        ).fetchone()
    assert written == (0, 0)
    migrate.upgrade(empty_database_url)
    async with running_worker(at_newest) as started:  # the newest revision: it starts
        assert started.ready.is_set()
