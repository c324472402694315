"""Exactly-once effects through the ORM: the job's transaction on SQLAlchemy's and Django's own connections.

Each adapter (``ctx.transaction(session)`` for SQLAlchemy's ``Session``,
``Connection``, ``AsyncSession``, ``AsyncConnection``; ``ctx.atomic()`` for
Django) runs the job's fence on the ORM's connection. On real PostgreSQL, with
jobs claimed as a worker claims them, for each one: the effect, the processed
row and the success commit together; a second delivery does not run the body;
a stale attempt's writes roll back; an exception commits nothing and the job
is retried. SQLAlchemy on psycopg2 and asyncpg runs the same statements
through ``text()``, so those drivers work too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import postbox
from postbox.errors import AlreadyProcessed
from postbox.fence import StaleAttempt, sqlstate
from postbox.relay import Relay
from postbox.settings import Settings
from postbox.streams import stream_key
from postbox.worker import claims
from postbox.worker.consumer import Consumer, ensure_groups
from postbox.worker.context import WorkerJobContext
from postbox.worker.delivery import Job
from tests.harness.publish import publish_due
from tests.harness.tasks import orm
from tests.harness.wait import wait_until_async
from tests.harness.worker import fetch, fetchval, running_worker, worker_settings

WORKER = "worker-aaaaaaaa"
Body = Callable[[], None]  # what the handler does inside the transaction besides its ORM write


@dataclass
class Run:
    """One kind of ORM transaction: a handler's body written with it, run on ``ctx``."""

    name: str
    runner: Callable[[WorkerJobContext, str, Body], Any]  # returns an awaitable
    calls: list[str]


class Orms:
    """The ORM objects of one test, on its database: SQLAlchemy engines (three drivers) and Django."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.engines: dict[str, Engine] = {}
        self.async_engines: dict[str, AsyncEngine] = {}

    def engine(self, driver: str) -> Engine:
        if driver not in self.engines:
            self.engines[driver] = create_engine(orm.sqlalchemy_url(driver))
        return self.engines[driver]

    def async_engine(self, driver: str) -> AsyncEngine:
        if driver not in self.async_engines:
            self.async_engines[driver] = create_async_engine(orm.sqlalchemy_url(driver))
        return self.async_engines[driver]

    async def close(self) -> None:
        for eng in self.engines.values():
            eng.dispose()
        for aeng in self.async_engines.values():
            await aeng.dispose()


@pytest.fixture
async def orms(database_url: str, aconn: psycopg.AsyncConnection[Any]) -> AsyncIterator[Orms]:
    await aconn.execute(orm.DDL)
    await aconn.commit()
    orm.use(database_url)
    django_database(database_url)
    found = Orms(database_url)
    try:
        yield found
    finally:
        try:
            await found.close()
        finally:
            await orm.dispose()  # the engines the worker's handlers made: their pooled connections closed


def django_database(database_url: str) -> None:
    """Django set up in this process, its default database this test's."""
    orm.django_ready()
    from django.db import connections

    connections.close_all()
    connections["default"].settings_dict.update(orm.django_settings(database_url))


def in_thread_with_django(fn: Body) -> Any:
    """Run ``fn`` on a thread, as the worker runs a sync handler; close that thread's Django connection after."""

    def call() -> None:
        from django.db import connections

        try:
            fn()
        finally:
            connections.close_all()

    return asyncio.to_thread(call)


def make_run(kind: str, orms: Orms) -> Run:
    calls: list[str] = []

    def sa_sync(driver: str, core: bool) -> Callable[[WorkerJobContext, str, Body], Any]:
        def runner(ctx: WorkerJobContext, label: str, body: Body) -> Any:
            def handler() -> None:  # a sync handler, on a thread
                if core:
                    with orms.engine(driver).connect() as conn, ctx.transaction(conn):
                        conn.execute(
                            text("INSERT INTO orm_effects (job_id, label, attempt) VALUES (:j, :l, :a)"),
                            {"j": ctx.job_id, "l": label, "a": ctx.attempt},
                        )
                        calls.append(label)
                        body()
                    return
                with Session(orms.engine(driver)) as session, ctx.transaction(session):
                    session.add(orm.Effect(job_id=ctx.job_id, label=label, attempt=ctx.attempt))
                    calls.append(label)
                    body()

            return asyncio.to_thread(handler)

        return runner

    def sa_async(driver: str, core: bool) -> Callable[[WorkerJobContext, str, Body], Any]:
        async def runner(ctx: WorkerJobContext, label: str, body: Body) -> None:
            if core:
                async with orms.async_engine(driver).connect() as conn, ctx.transaction(conn):
                    await conn.execute(
                        text("INSERT INTO orm_effects (job_id, label, attempt) VALUES (:j, :l, :a)"),
                        {"j": ctx.job_id, "l": label, "a": ctx.attempt},
                    )
                    calls.append(label)
                    body()
                return
            async with AsyncSession(orms.async_engine(driver)) as session, ctx.transaction(session):
                session.add(orm.Effect(job_id=ctx.job_id, label=label, attempt=ctx.attempt))
                calls.append(label)
                body()

        return runner

    def django(ctx: WorkerJobContext, label: str, body: Body) -> Any:
        model = orm.django_ready()

        def handler() -> None:
            with ctx.atomic():
                model.objects.create(job_id=ctx.job_id, label=label, attempt=ctx.attempt)
                calls.append(label)
                body()

        return in_thread_with_django(handler)

    runners = {
        "sa_session": sa_sync("psycopg", core=False),
        "sa_connection": sa_sync("psycopg", core=True),
        "sa_async_session": sa_async("psycopg", core=False),
        "sa_async_connection": sa_async("psycopg", core=True),
        "sa_session_psycopg2": sa_sync("psycopg2", core=False),
        "sa_async_session_asyncpg": sa_async("asyncpg", core=False),
        "django": django,
    }
    return Run(kind, runners[kind], calls)


KINDS = [
    "sa_session",
    "sa_connection",
    "sa_async_session",
    "sa_async_connection",
    "sa_session_psycopg2",
    "sa_async_session_asyncpg",
    "django",
]


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with AsyncConnectionPool(database_url, min_size=1, max_size=3, kwargs={"autocommit": True}) as p:
        yield p


async def claimed(
    aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, prefix: str, pool: AsyncConnectionPool[Any]
) -> Job:
    """One job enqueued, published, read and claimed by WORKER, as the worker does before running it."""
    await postbox.enqueue_async(aconn, orm.orm_sa_effect, {"label": "x"})
    await aconn.commit()
    stream = stream_key(prefix, orm.QUEUE, 5)
    await ensure_groups(redis, [stream])
    await publish_due(aconn, redis, prefix)
    deliveries, _, _ = await Consumer(redis, consumer=WORKER).read([stream], 1)
    [job] = (await claims.claim(pool, deliveries, worker_id=WORKER, lease=30)).run
    return job


def ctx_for(job: Job, pool: AsyncConnectionPool[Any]) -> WorkerJobContext:
    return WorkerJobContext(job, worker_id=WORKER, pool=pool, registry=postbox.default_registry, deadline=None)


def nothing() -> None:
    return None


async def state(aconn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    """(effects, processed rows, job state, attempts recorded) — what committed."""
    return [
        (
            await fetchval(aconn, "SELECT count(*) FROM orm_effects"),
            await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs"),
            await fetchval(aconn, "SELECT state FROM postbox.outbox"),
            await fetch(aconn, "SELECT attempt, worker_id, outcome FROM postbox.job_attempts"),
        )
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_the_effect_the_processed_row_and_the_success_commit_together(
    kind: str,
    orms: Orms,
    aconn: psycopg.AsyncConnection[Any],
    redis: aioredis.Redis,
    settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:
    run = make_run(kind, orms)
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)
    await run.runner(ctx, "once", nothing)
    assert ctx.committed
    assert run.calls == ["once"]
    assert await fetch(aconn, "SELECT job_id, label, attempt FROM orm_effects") == [(job.id, "once", 1)]
    assert await state(aconn) == [(1, 1, "succeeded", [(1, WORKER, "succeeded")])]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_second_delivery_of_a_committed_job_does_not_run_the_body(
    kind: str,
    orms: Orms,
    aconn: psycopg.AsyncConnection[Any],
    redis: aioredis.Redis,
    settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:
    run = make_run(kind, orms)
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    await run.runner(ctx_for(job, pool), "first", nothing)
    again = ctx_for(job, pool)
    with pytest.raises(AlreadyProcessed):
        await run.runner(again, "second", nothing)
    assert not again.committed
    assert run.calls == ["first"]  # the second body never ran
    assert await fetch(aconn, "SELECT label FROM orm_effects") == [("first",)]
    assert await state(aconn) == [(1, 1, "succeeded", [(1, WORKER, "succeeded")])]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stale_attempts_orm_writes_roll_back(
    kind: str,
    orms: Orms,
    aconn: psycopg.AsyncConnection[Any],
    redis: aioredis.Redis,
    settings: Settings,
    pool: AsyncConnectionPool[Any],
    database_url: str,
) -> None:
    run = make_run(kind, orms)
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)

    def taken_over() -> None:  # while the body runs, another claim takes the job (a newer attempt)
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute("UPDATE postbox.outbox SET attempts = attempts + 1, claimed_by = 'worker-bbbbbbbb'")

    with pytest.raises(StaleAttempt):
        await run.runner(ctx, "stale", taken_over)
    assert not ctx.committed
    assert run.calls == ["stale"]
    assert await state(aconn) == [(0, 0, "running", [])]
    assert await fetch(aconn, "SELECT attempts, claimed_by FROM postbox.outbox") == [(2, "worker-bbbbbbbb")]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_exception_in_the_body_commits_nothing(
    kind: str,
    orms: Orms,
    aconn: psycopg.AsyncConnection[Any],
    redis: aioredis.Redis,
    settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:
    run = make_run(kind, orms)
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)

    def fails() -> None:
        raise ValueError("the business rule failed")

    with pytest.raises(ValueError, match="business rule"):
        await run.runner(ctx, "failed", fails)
    assert not ctx.committed
    assert await state(aconn) == [(0, 0, "running", [])]


# --- through a real worker: a failing first attempt is retried, its effect counted once ------------------


@pytest.mark.parametrize("task_name", ["orm_sa_effect", "orm_sa_async_effect", "orm_django_effect"])
async def test_a_worker_retries_a_failed_orm_body_and_the_effect_commits_once(
    task_name: str, orms: Orms, aconn: psycopg.AsyncConnection[Any], settings: Settings
) -> None:
    s = worker_settings(settings, queues=[orm.QUEUE])
    relay = Relay(s)
    relay_task = asyncio.create_task(relay.run())
    try:
        async with running_worker(s):
            job_id = await postbox.enqueue_async(aconn, task_name, {"label": task_name, "fail_first": True})
            await aconn.commit()

            async def done() -> bool:
                return await fetchval(aconn, "SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)) == "succeeded"

            await wait_until_async(done, 30, message=f"{task_name} succeeded")
    finally:
        relay.stop()
        await asyncio.wait_for(relay_task, 10)
    assert await fetch(aconn, "SELECT job_id, label, attempt FROM orm_effects") == [(job_id, task_name, 2)]
    assert await fetch(aconn, "SELECT attempt, outcome FROM postbox.job_attempts ORDER BY attempt") == [
        (1, "retry"),
        (2, "succeeded"),
    ]
    assert await fetchval(aconn, "SELECT count(*) FROM postbox.processed_jobs") == 1


# --- refusals: a clear error, nothing written, the run's transaction still to be had -------------------------


async def test_a_session_already_in_a_transaction_is_refused(
    orms: Orms, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:  # fmt: skip
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)

    def handler() -> None:
        with Session(orms.engine("psycopg")) as session:
            session.execute(text("SELECT 1"))  # autobegins the session's transaction
            with pytest.raises(RuntimeError, match="already in a transaction"), ctx.transaction(session):
                pass

    await asyncio.to_thread(handler)
    async with AsyncSession(orms.async_engine("psycopg")) as session:
        await session.execute(text("SELECT 1"))
        with pytest.raises(RuntimeError, match="already in a transaction"):
            async with ctx.transaction(session):
                pass
    assert await state(aconn) == [(0, 0, "running", [])]
    async with ctx.transaction() as conn:  # the refusals did not use up the run's transaction
        await conn.execute("SELECT 1")
    assert ctx.committed


async def test_the_wrong_form_for_a_sync_or_async_object_names_the_right_one(
    orms: Orms, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:  # fmt: skip
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)
    with Session(orms.engine("psycopg")) as session:
        with pytest.raises(TypeError, match=r"with ctx\.transaction\(session\)` in a sync handler"):
            async with ctx.transaction(session):
                pass
        # A sync Session on the event loop (an async handler) would block the worker: refused.
        with pytest.raises(RuntimeError, match="would block the worker's event loop"), ctx.transaction(session):
            pass
    async with AsyncSession(orms.async_engine("psycopg")) as asession:
        with pytest.raises(TypeError, match=r"async with ctx\.transaction\(session\)"), ctx.transaction(asession):
            pass
    with pytest.raises(TypeError, match="needs a SQLAlchemy Session or Connection"), ctx.transaction(object()):
        pass
    assert await state(aconn) == [(0, 0, "running", [])]


async def test_a_body_that_commits_the_session_itself_gets_an_error(
    orms: Orms, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:  # fmt: skip
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)
    async with AsyncSession(orms.async_engine("psycopg")) as session:
        with pytest.raises(RuntimeError, match=r"ended or failed inside ctx\.transaction"):
            async with ctx.transaction(session):
                session.add(orm.Effect(job_id=job.id, label="early", attempt=1))
                await session.commit()
    assert not ctx.committed
    # Committed with its processed row (the body's doing), the success never recorded:
    # the job's next run finds the row and runs no body again.
    assert await state(aconn) == [(1, 1, "running", [])]


async def test_django_refuses_a_nested_atomic_block_and_an_async_handler(
    orms: Orms, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:  # fmt: skip
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)
    with pytest.raises(RuntimeError, match=r"sync function \(def\) using `with ctx\.atomic\(\):`"), ctx.atomic():
        pass  # on the event loop: an async handler

    def nested() -> None:
        from django.db import transaction

        with transaction.atomic(), pytest.raises(RuntimeError, match="outermost"), ctx.atomic():
            pass

    await in_thread_with_django(nested)
    assert await state(aconn) == [(0, 0, "running", [])]


async def test_django_from_an_async_handler_through_sync_to_async(
    orms: Orms, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings,
    pool: AsyncConnectionPool[Any],
) -> None:  # fmt: skip
    from asgiref.sync import sync_to_async
    from django.db import connections

    model = orm.django_ready()
    job = await claimed(aconn, redis, settings.redis_prefix, pool)
    ctx = ctx_for(job, pool)

    def write() -> None:
        try:
            with ctx.atomic():
                model.objects.create(job_id=ctx.job_id, label="async", attempt=ctx.attempt)
        finally:
            connections.close_all()

    await sync_to_async(write, thread_sensitive=False)()
    assert ctx.committed
    assert await state(aconn) == [(1, 1, "succeeded", [(1, WORKER, "succeeded")])]


def test_sqlstate_is_found_through_the_wrappers_of_every_driver() -> None:
    class Driver(Exception):
        sqlstate = "PB001"

    class Psycopg2(Exception):
        pgcode = "PB001"

    class Wrapped(Exception):
        def __init__(self, orig: BaseException) -> None:
            self.orig = orig

    try:
        try:
            raise Driver()
        except Driver as exc:
            raise RuntimeError("django's wrapper") from exc
    except RuntimeError as chained:
        assert sqlstate(chained) == "PB001"
    assert sqlstate(Wrapped(Psycopg2())) == "PB001"
    assert sqlstate(ValueError()) is None


@pytest.fixture(autouse=True)
def _no_leftover_django_connections() -> Iterator[None]:
    yield
    import sys

    if "django.db" in sys.modules:
        from django.db import connections

        connections.close_all()
