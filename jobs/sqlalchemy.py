"""A job's transaction on a SQLAlchemy ``Session`` or ``Connection``: the handler's ORM writes, exactly once.

``ctx.transaction(session)`` (what handlers write) and the functions here run
the job's fence (:class:`postbox.fence.JobFence`) on the connection of the
ORM object the handler gives, so the processed row, the handler's writes and
the fenced success commit together, or none of them do::

    @task()
    def credit(ctx, account_id: int) -> None:            # sync handler: a worker thread
        with Session(engine) as session, ctx.transaction(session):
            session.get(Account, account_id).balance += 10

    @task()
    async def credit_async(ctx, account_id: int) -> None:
        async with AsyncSession(async_engine) as session, ctx.transaction(session):
            (await session.get(Account, account_id)).balance += 10

The adapter owns the transaction's boundaries: it refuses an object already
in a transaction (the job's must be the outermost, or the success would commit
with work the handler did before), begins, runs ``begin_processed`` (an earlier
run committed: :class:`~postbox.errors.AlreadyProcessed`, the body does not
run), yields, flushes the session, runs the fenced ``record_success`` (refused:
:class:`~postbox.fence.StaleAttempt`) and commits; any exception rolls back.
Savepoints (``begin_nested()``) inside the body are fine; ending the
transaction inside it (``commit()``, ``rollback()``) is an error.

Sync objects (``Session``, ``Connection``) take ``with``, from a sync handler
(it runs on a worker thread); async ones (``AsyncSession``,
``AsyncConnection``) take ``async with``. The statements go through
SQLAlchemy (``text()``), so any PostgreSQL driver works: psycopg 3
(``postgresql+psycopg``), psycopg2 and asyncpg are tested.

SQLAlchemy is imported only when one of these is called.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from postbox.fence import JobFence

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

__all__ = ["JobTransaction", "job_transaction", "job_transaction_async"]

S = TypeVar("S", bound="Session | Connection")
A = TypeVar("A", bound="AsyncSession | AsyncConnection")


class FencedContext(Protocol):
    """What the adapters need of ``ctx``: the run's fence, and where to say the success committed."""

    committed: bool

    def job_fence(self) -> JobFence: ...


@contextmanager
def job_transaction(ctx: FencedContext, orm: S) -> Iterator[S]:
    """The job's transaction on a sync ``Session`` or ``Connection``; yields ``orm``.

    Use from a sync handler. ``ctx.transaction(orm)`` is the same.
    """
    _sync_kind(orm)
    _refuse_on_event_loop(orm)
    _refuse_open_transaction(orm)
    fence = _fence(ctx)
    from sqlalchemy import text

    tx = orm.begin()
    try:
        fence.check_fresh(orm.execute(text(fence.begin_sql_named), fence.begin_params).scalar())
        yield orm
        _require_open(tx, fence)
        flush = getattr(orm, "flush", None)  # a Session: its pending ORM writes go first
        if flush is not None:
            flush()
        _record_success(orm.execute, text(fence.success_sql_named), fence)
        tx.commit()
    except BaseException:
        if orm.in_transaction():
            orm.rollback()
        raise
    ctx.committed = True


@asynccontextmanager
async def job_transaction_async(ctx: FencedContext, orm: A) -> AsyncIterator[A]:
    """The job's transaction on an ``AsyncSession`` or SQLAlchemy ``AsyncConnection``; yields ``orm``.

    ``ctx.transaction(orm)`` is the same.
    """
    _async_kind(orm)
    _refuse_open_transaction(orm)
    fence = _fence(ctx)
    from sqlalchemy import text

    tx = await orm.begin()
    try:
        result = await orm.execute(text(fence.begin_sql_named), fence.begin_params)
        fence.check_fresh(result.scalar())
        yield orm
        _require_open(tx, fence)
        flush = getattr(orm, "flush", None)
        if flush is not None:
            await flush()
        try:
            await orm.execute(text(fence.success_sql_named), fence.success_params)
        except BaseException as exc:
            if fence.refused(exc):
                raise fence.stale() from None
            raise
        await tx.commit()
    except BaseException:
        if orm.in_transaction():
            await orm.rollback()
        raise
    ctx.committed = True


class JobTransaction:
    """What ``ctx.transaction(orm)`` returns: ``with`` for a sync ORM object, ``async with`` for an async one.

    The wrong form is refused with an error that names the right one.
    """

    def __init__(self, ctx: FencedContext, orm: Any) -> None:
        self._ctx = ctx
        self._orm = orm
        self._sync: AbstractContextManager[Any] | None = None
        self._async: AbstractAsyncContextManager[Any] | None = None

    def __enter__(self) -> Any:
        if _is_async(self._orm):
            raise TypeError(
                f"{type(self._orm).__name__} is async: use `async with ctx.transaction(session)` in an async handler"
            )
        self._sync = job_transaction(self._ctx, self._orm)
        return self._sync.__enter__()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._sync is not None
        return self._sync.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        if not _is_async(self._orm):
            _sync_kind(self._orm)  # not SQLAlchemy at all: say what is accepted
            raise TypeError(
                f"a sync SQLAlchemy {type(self._orm).__name__} would block the worker's event loop: use"
                " `with ctx.transaction(session)` in a sync handler (def, not async def), or an AsyncSession"
            )
        self._async = job_transaction_async(self._ctx, self._orm)
        return await self._async.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._async is not None
        return await self._async.__aexit__(exc_type, exc, tb)


ACCEPTED = "a SQLAlchemy Session or Connection (with), or an AsyncSession or AsyncConnection (async with)"


def _is_async(orm: object) -> bool:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    return isinstance(orm, AsyncSession | AsyncConnection)


def _sync_kind(orm: object) -> None:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(orm, Session | Connection):
        return
    if _is_async(orm):
        raise TypeError(f"{type(orm).__name__} is async: use `async with ctx.transaction(session)`")
    raise TypeError(f"ctx.transaction(orm) needs {ACCEPTED}, not {type(orm).__name__}")


def _async_kind(orm: object) -> None:
    if not _is_async(orm):
        _sync_kind(orm)
        raise TypeError(f"{type(orm).__name__} is sync: use `with ctx.transaction(session)` in a sync handler")


def _refuse_on_event_loop(orm: object) -> None:
    """A sync ORM call on the worker's event loop would stop its heartbeats: refuse it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"a sync SQLAlchemy {type(orm).__name__} inside an async handler would block the worker's event loop:"
        " write the handler as a sync function (def) or use an AsyncSession with `async with ctx.transaction(session)`"
    )


def _refuse_open_transaction(orm: Any) -> None:
    if orm.in_transaction():
        raise RuntimeError(
            f"this {type(orm).__name__} is already in a transaction: the job's transaction must be its outermost one"
            " (commit or roll back first, or pass a fresh session)"
        )


def _fence(ctx: Any) -> JobFence:
    take = getattr(ctx, "job_fence", None)
    if take is None:
        raise TypeError(f"{type(ctx).__name__} cannot run a job's transaction on an ORM connection (no job_fence())")
    fence: JobFence = take()
    return fence


def _require_open(tx: Any, fence: JobFence) -> None:
    if not tx.is_active:
        raise RuntimeError(
            f"job {fence.job_id}: the job's transaction was ended or failed inside ctx.transaction(orm)"
            " (commit() and rollback() belong to the adapter; use begin_nested() for a savepoint)"
        )


def _record_success(execute: Any, statement: Any, fence: JobFence) -> None:
    try:
        execute(statement, fence.success_params)
    except BaseException as exc:
        if fence.refused(exc):
            raise fence.stale() from None
        raise
