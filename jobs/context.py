"""What a handler receives as ``ctx``: the interface the worker implements.

Handlers are written against this protocol (the Stagedoor jobs are), so they
can be unit-tested with a small stand-in and run unchanged by the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Unpack, overload

from psycopg import AsyncConnection

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    from postbox.fence import JobFence
    from postbox.producer import EnqueueOptions
    from postbox.workflow import Upstream

_S = TypeVar("_S", bound="Session | SAConnection")
_A = TypeVar("_A", bound="AsyncSession | SAAsyncConnection")


class JobContext(Protocol):
    job_id: int  # the outbox id: the job's identity everywhere
    task: str
    queue: str
    attempt: int  # 1-based; counted when the worker claimed this run
    max_attempts: int
    headers: Mapping[str, Any]
    worker_id: str
    deadline: float | None  # time.monotonic() value past which the run times out
    log: logging.LoggerAdapter[logging.Logger]
    committed: bool  # the job's success committed inside its transaction (set by the transaction's owner)

    @overload
    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...
    @overload
    def transaction(self, orm: _S) -> AbstractContextManager[_S]: ...
    @overload
    def transaction(self, orm: _A) -> AbstractAsyncContextManager[_A]: ...
    def transaction(self, orm: Any = None) -> Any:
        """Open the job's effect transaction: ``async with ctx.transaction() as conn``.

        On entry the processed row ``processed_jobs(outbox_id)`` is inserted; if
        the id was already there, :class:`postbox.errors.AlreadyProcessed` is
        raised and the body does not run. The job's success commits in this same
        transaction, fenced: a run whose attempt is no longer current rolls back
        (:class:`postbox.fence.StaleAttempt`).

        Without ``orm`` it runs on a psycopg ``AsyncConnection`` of the worker's.
        With a SQLAlchemy object it runs on that object's connection
        (:mod:`postbox.sqlalchemy`): ``with ctx.transaction(session)`` for a sync
        ``Session`` / ``Connection`` in a sync handler, ``async with`` for an
        ``AsyncSession`` / ``AsyncConnection``.
        """
        ...

    def atomic(self, using: str | None = None) -> AbstractContextManager[None]:
        """The job's transaction on Django's connection ``using``: ``with ctx.atomic():`` (:mod:`postbox.django.job`).

        ``transaction.atomic()`` with the processed row and the fenced success in
        it; must be the outermost atomic block; sync handlers only.
        """
        ...

    def job_fence(self) -> JobFence:
        """The run's :class:`postbox.fence.JobFence`, for an adapter running the job's transaction itself.

        Counts as entering the job's transaction (once per run); the adapter sets
        ``committed`` once its commit succeeded.
        """
        ...

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
    ) -> int:
        """Enqueue a follow-up job through the outbox, inside the open ``transaction()`` (options: EnqueueOptions)."""
        ...

    @property
    def cancelled(self) -> bool:
        """True once an operator asked to cancel this running job (cooperative)."""
        ...

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the run got: ``done`` of ``total`` (None: unknown), with a short note.

        Call it as often as you like: the worker writes it to the job's row at most
        once a second and its last value before the run's outcome; shown by the API,
        ``postbox jobs get``, the dashboard and the events (docs/job-control.md).
        A bad value raises :class:`postbox.progress.ProgressError`.
        """
        ...

    async def upstream(self) -> Upstream:
        """The upstream jobs of this job in its workflow, as they ended: their states, kept results
        (``.results(task)``, typed by that task's handler) and recorded failures (docs/workflows.md)."""
        ...
