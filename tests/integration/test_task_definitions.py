"""Task defaults known to the database: what a worker loads, `postbox.enqueue()` in SQL applies."""

from __future__ import annotations

from typing import Any

import psycopg

from postbox import definitions
from postbox.registry import Registry, RetryPolicy, task
from postbox.settings import Settings
from tests.harness.tasks import worker as tasks_worker
from tests.harness.worker import running_worker, worker_settings

ROW = "SELECT queue, priority, max_attempts, timeout_seconds, keep_result FROM postbox.outbox WHERE id = %s"


def sql_enqueue(conn: psycopg.Connection[Any], call: str) -> tuple[Any, ...]:
    job = conn.execute(call).fetchone()[0]  # type: ignore[index]
    conn.commit()
    return conn.execute(ROW, (job,)).fetchone()  # type: ignore[return-value]


async def test_published_definitions_are_what_the_sql_function_applies(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    registry = Registry()

    @task(registry=registry, queue="reports", priority=8, max_attempts=2, timeout=30, keep_result=True)
    async def nightly_report(ctx: Any, day: str) -> None: ...

    @task(registry=registry, retry=RetryPolicy(base_delay=2.0))
    async def plain(ctx: Any) -> None: ...

    assert await definitions.publish(aconn, registry, by="test") == 2
    await aconn.commit()
    assert await definitions.publish(aconn, registry, by="again") == 0  # unchanged: nothing written
    await aconn.commit()
    assert sql_enqueue(conn, "SELECT postbox.enqueue('nightly_report', '{\"day\": \"mon\"}')") == (
        "reports",
        8,
        2,
        30.0,
        True,
    )
    # Explicit arguments win; a task nobody published gets the built-in defaults.
    assert sql_enqueue(conn, "SELECT postbox.enqueue('nightly_report', '{}', priority => 1, queue => 'q')") == (
        "q",
        1,
        2,
        30.0,
        True,
    )
    assert sql_enqueue(conn, "SELECT postbox.enqueue('unknown_task')") == ("default", 5, 5, None, False)
    rows = conn.execute("SELECT name, retry, updated_by FROM postbox.tasks ORDER BY name").fetchall()
    assert rows == [("nightly_report", {}, "test"), ("plain", {"base_delay": 2.0}, "test")]


async def test_a_worker_publishes_its_tasks_when_it_starts(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    async with running_worker(worker_settings(settings)):
        names = {name for (name,) in conn.execute("SELECT name FROM postbox.tasks")}
    assert "w_add" in names
    conn.commit()
    # Enqueued from SQL without options: the task's own queue, where the worker reads.
    assert sql_enqueue(conn, "SELECT postbox.enqueue('w_add', '{\"a\": 1, \"b\": 2}')")[:3] == (
        tasks_worker.QUEUE,
        5,
        5,
    )
