"""postbox.testing on a shared database: the helpers see the test's own jobs only, on every connection.

The database already holds committed jobs of the same tasks (succeeded and
pending, as a developer's database does); each test writes its own in an open
transaction, on psycopg, SQLAlchemy (sync and async) or Django's connection,
and the helpers list, assert and run those alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from postbox import enqueue, enqueue_async, migrate, producer, schema, task
from postbox.errors import UnsupportedConnectionError
from postbox.registry import Registry
from postbox.testing import (
    assert_enqueued,
    assert_enqueued_async,
    assert_not_enqueued,
    assert_not_enqueued_async,
    enqueued,
    enqueued_async,
    run_enqueued,
    run_enqueued_sync,
)
from tests.harness.tasks import orm

shop = Registry()


@task(registry=shop, keep_result=True)
def send_receipt(ctx: Any, order_id: int) -> str:
    return f"receipt-{order_id}"


@task(registry=shop, keep_result=True)
async def charge(ctx: Any, order_id: int) -> int:
    async with ctx.transaction() as conn:
        await conn.execute("INSERT INTO charged (order_id) VALUES (%s)", (order_id,))
    return order_id


@pytest.fixture
def shared(database_url: str) -> str:
    """A database with committed jobs of the test's tasks: 3 succeeded, 2 pending (and due)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE charged (order_id int)")
        for n in range(5):
            enqueue(conn, send_receipt, {"order_id": 100 + n}, registry=shop)
        conn.execute("UPDATE postbox.outbox SET state = 'succeeded' WHERE id <= 3")
    return database_url


def committed_untouched(url: str) -> None:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT state, attempts, count(*) FROM postbox.outbox GROUP BY 1, 2 ORDER BY 1").fetchall()
    assert rows == [("pending", 0, 2), ("succeeded", 0, 3)]


def test_psycopg_sees_and_runs_only_its_own_transaction(shared: str) -> None:
    with psycopg.connect(shared) as conn:
        assert enqueued(conn) == []
        assert_not_enqueued(conn, send_receipt)  # 5 committed ones are there: not the test's
        mine = enqueue(conn, send_receipt, {"order_id": 1}, registry=shop)
        [job] = assert_enqueued(conn, send_receipt, count=1)
        assert (job.id, job.args, job.state) == (mine, {"order_id": 1}, "pending")
        runs = run_enqueued_sync(conn, registry=shop)
        assert [(r.job_id, r.state, r.result) for r in runs] == [(mine, "succeeded", "receipt-1")]
        assert [j.state for j in enqueued(conn)] == ["succeeded"]
        conn.rollback()
    committed_untouched(shared)


def test_savepoints_count_as_the_transaction_and_rolled_back_ones_do_not(shared: str) -> None:
    with psycopg.connect(shared) as conn:
        enqueue(conn, send_receipt, {"order_id": 1}, registry=shop)
        with conn.transaction():  # a savepoint, released
            with conn.transaction():
                enqueue(conn, send_receipt, {"order_id": 2}, registry=shop)
        with pytest.raises(ZeroDivisionError), conn.transaction():
            enqueue(conn, send_receipt, {"order_id": 3}, registry=shop)
            raise ZeroDivisionError
        with conn.transaction():  # still open while the helper looks
            enqueue(conn, send_receipt, {"order_id": 4}, registry=shop)
            assert [j.args["order_id"] for j in enqueued(conn)] == [1, 2, 4]
        conn.rollback()


def test_jobs_committed_by_another_transaction_since_are_not_the_tests(shared: str) -> None:
    with psycopg.connect(shared) as conn, psycopg.connect(shared, autocommit=True) as other:
        enqueue(conn, send_receipt, {"order_id": 1}, registry=shop)
        enqueue(other, send_receipt, {"order_id": 2}, registry=shop)  # committed while the test's is open
        assert [j.args for j in enqueued(conn)] == [{"order_id": 1}]
        assert [r.job_id for r in run_enqueued_sync(conn, registry=shop)] == [enqueued(conn)[0].id]
        conn.rollback()


def test_sqlalchemy_session(shared: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("postgresql+psycopg://" + shared.split("://", 1)[1])
    try:
        with Session(engine) as session:
            mine = enqueue(session, send_receipt, {"order_id": 1}, registry=shop)
            assert [j.id for j in assert_enqueued(session, send_receipt, count=1)] == [mine]
            assert [r.state for r in run_enqueued_sync(session, registry=shop)] == ["succeeded"]
            session.rollback()
    finally:
        engine.dispose()
    committed_untouched(shared)


def test_sqlalchemy_on_psycopg2_lists_and_refuses_to_run(shared: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine("postgresql+psycopg2://" + shared.split("://", 1)[1])
    try:
        with Session(engine) as session:
            enqueue(session, send_receipt, {"order_id": 1}, registry=shop)
            [job] = assert_enqueued(session, send_receipt, args={"order_id": 1}, count=1)
            assert job.headers == {} and job.state == "pending"
            with pytest.raises(UnsupportedConnectionError, match=r"run_enqueued_sync\(\) runs jobs on psycopg 3"):
                run_enqueued_sync(session, registry=shop)
            session.rollback()
    finally:
        engine.dispose()


async def test_sqlalchemy_async_session(shared: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine("postgresql+psycopg://" + shared.split("://", 1)[1])
    try:
        async with AsyncSession(engine) as session:
            await assert_not_enqueued_async(session, send_receipt)
            mine = await enqueue_async(session, charge, {"order_id": 7}, registry=shop)
            assert [j.id for j in await assert_enqueued_async(session, charge, count=1)] == [mine]
            runs = await run_enqueued(session, registry=shop)
            assert [(r.task, r.state, r.result) for r in runs] == [("charge", "succeeded", 7)]
            assert [j.state for j in await enqueued_async(session)] == ["succeeded"]
            with pytest.raises(UnsupportedConnectionError, match=r"enqueued\(\) needs a sync connection"):
                enqueued(session)  # type: ignore[arg-type]
            await session.rollback()
    finally:
        await engine.dispose()
    committed_untouched(shared)


def test_the_wrong_twin_is_named(shared: str) -> None:
    with psycopg.connect(shared) as conn:
        with pytest.raises(UnsupportedConnectionError, match=r"use run_enqueued_sync\(\)"):
            asyncio.run(run_enqueued(conn))  # type: ignore[arg-type]


@pytest.fixture
def django_connection(shared: str) -> Iterator[Any]:
    import django
    from django.conf import settings
    from django.db import connections

    if not settings.configured:  # else another test of this process did, as tests/harness/tasks/orm.py does
        settings.configure(DATABASES={"default": orm.django_settings(shared)}, USE_TZ=True, INSTALLED_APPS=[])
        django.setup()

    connections.close_all()
    connections["default"].settings_dict.update(orm.django_settings(shared))
    try:
        yield connections["default"]
    finally:
        connections.close_all()


def test_django_connection_in_atomic_blocks(shared: str, django_connection: Any) -> None:
    from django.db import connection, transaction

    with pytest.raises(ZeroDivisionError), transaction.atomic():  # as Django's TestCase wraps a test
        with transaction.atomic():  # a savepoint, as the code under test opens one
            mine = enqueue(connection, send_receipt, {"order_id": 1}, registry=shop)
        # Django's loader hands jsonb over as text: parsed all the same.
        [job] = assert_enqueued(connection, send_receipt, args={"order_id": 1}, count=1)
        assert (job.id, job.args) == (mine, {"order_id": 1})
        assert_not_enqueued(connection, send_receipt, args={"order_id": 100})  # committed: not the test's
        runs = run_enqueued_sync(connection, registry=shop)
        assert [(r.job_id, r.state, r.result) for r in runs] == [(mine, "succeeded", "receipt-1")]
        raise ZeroDivisionError  # roll the test's transaction back
    committed_untouched(shared)


@pytest.fixture
def own_schema(database_url: str) -> Iterator[str]:
    schema.use("postbox_test")
    producer._limits_from_settings.cache_clear()  # the next enqueue loads the settings again
    try:
        migrate.upgrade(database_url)
        yield "postbox_test"
    finally:
        schema.reset()
        producer._limits_from_settings.cache_clear()


def test_schema_use_holds_across_enqueues_that_load_the_settings(database_url: str, own_schema: str) -> None:
    with psycopg.connect(database_url) as conn:
        enqueue(conn, send_receipt, {"order_id": 1}, registry=shop)  # loads the settings: POSTBOX_SCHEMA unset
        assert schema.active() == own_schema
        enqueue(conn, send_receipt, {"order_id": 2}, registry=shop)
        assert [j.args["order_id"] for j in enqueued(conn)] == [1, 2]
        conn.commit()
        counts = "SELECT (SELECT count(*) FROM postbox_test.outbox), (SELECT count(*) FROM postbox.outbox)"
        assert conn.execute(counts).fetchone() == (2, 0)
