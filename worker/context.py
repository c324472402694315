"""The ``ctx`` a handler receives: the worker's implementation of :class:`postbox.context.JobContext`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Unpack

import orjson
import psycopg
from psycopg import AsyncClientCursor, AsyncConnection
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool

from postbox import sql
from postbox.fence import JobFence, StaleAttempt
from postbox.producer import EnqueueOptions, enqueue_async
from postbox.progress import Progress, Throttle, progress
from postbox.registry import Registry
from postbox.worker.delivery import Job
from postbox.workflow import Upstream, read_upstream

logger = logging.getLogger("postbox.job")  # a public name, not the module's: docs/operations.md, Logging

__all__ = ["StaleAttempt", "WorkerJobContext"]  # StaleAttempt lives in postbox.fence (the ORM adapters raise it too)


_NO_LINE = contextlib.nullcontext()


class WorkerJobContext:
    """One run of one job. ``transaction()`` may be entered once per run."""

    def __init__(
        self,
        job: Job,
        *,
        worker_id: str,
        pool: AsyncConnectionPool[Any],
        registry: Registry,
        deadline: float | None,
        transactions: asyncio.Semaphore | None = None,
        on_progress: Callable[[Job, Progress], None] | None = None,
    ) -> None:
        delivery = job.delivery
        self._job = job
        self._pool = pool
        self._transactions: contextlib.AbstractAsyncContextManager[Any] = transactions or _NO_LINE
        self._registry = registry
        self._conn: AsyncConnection[Any] | None = None
        self._entered = False
        self._headers: Mapping[str, Any] | None = None
        self.committed = False  # the job's success committed inside transaction()
        self.job_id = delivery.job_id
        self.task = delivery.task
        self.queue = delivery.queue
        self.attempt = job.attempt
        self.max_attempts = job.max_attempts
        self.worker_id = worker_id
        self.deadline = deadline
        # The progress throttle and the logger are made at first use: most runs use
        # neither, and making both for every run was about a tenth of a no-op job's
        # worker CPU (docs/benchmarks.md, issue 30).
        self._progress_throttle: Throttle | None = None
        self._progress_write: asyncio.Task[None] | None = None
        self._on_progress = on_progress
        self._log: logging.LoggerAdapter[logging.Logger] | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The run's logger: records carry the job's id, task, queue, attempt and worker."""
        if self._log is None:
            self._log = logging.LoggerAdapter(
                logger,
                {
                    "outbox_id": self.job_id,
                    "task": self.task,
                    "queue": self.queue,
                    "attempt": self.attempt,
                    "worker_id": self.worker_id,
                },
            )
        return self._log

    @property
    def _progress(self) -> Throttle:
        if self._progress_throttle is None:
            self._progress_throttle = Throttle()
        return self._progress_throttle

    @property
    def headers(self) -> Mapping[str, Any]:
        if self._headers is None:
            value = orjson.loads(self._job.delivery.headers or "{}")
            self._headers = value if isinstance(value, dict) else {}
        return self._headers

    @property
    def cancelled(self) -> bool:
        return self._job.cancel_requested

    def job_fence(self) -> JobFence:
        """The run's fence, for a job's transaction on a connection other than the worker's.

        Counts as entering the job's transaction: one per run, whichever form
        (``transaction()``, ``transaction(orm)``, ``atomic()``). The caller runs
        the fence's two statements around the body and sets ``committed``.
        """
        if self._entered:
            raise RuntimeError("the job's transaction (ctx.transaction() / ctx.atomic()) may be entered once per run")
        self._entered = True
        return JobFence(self.job_id, self.worker_id, self.attempt)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        fence = self.job_fence()
        statements = fence.statements
        # In the worker's line for a handler's connection first (worker.handler_gate).
        async with self._transactions, self._pool.connection() as conn:
            # Two round trips besides the body's own statements, each one simple query
            # of two statements (client-side parameters: one send, one wait):
            # 1. BEGIN + the processed row. The row is inserted before the body runs: it
            #    is the lock a concurrent run of the same job waits on, to then find it
            #    committed (AlreadyProcessed) or rolled back (and insert it itself).
            cur = AsyncClientCursor(conn)
            try:
                await cur.execute(statements.PROCESSED_BEGIN_TRANSACTION, fence.begin_params, prepare=False)
                cur.nextset()  # past BEGIN's
                row = await cur.fetchone()
                fence.check_fresh(row[0] if row is not None else None)
            except BaseException:
                await _roll_back(conn)
                raise
            self._conn = conn
            try:
                yield conn
            except BaseException:
                await _roll_back(conn)
                raise
            finally:
                self._conn = None
            if conn.pgconn.transaction_status != TransactionStatus.INTRANS:
                # The body ended the job's transaction itself (commit() or rollback()), or
                # left it failed: the success cannot join it.
                await _roll_back(conn)
                raise RuntimeError(
                    f"job {self.job_id}: the job's transaction was ended or failed inside ctx.transaction()"
                )
            # 2. The success outcome (fenced) + COMMIT. A refused fence raises in the
            #    outcome statement: PostgreSQL skips the COMMIT behind it, and the
            #    body's effects roll back with the processed row.
            try:
                await cur.execute(statements.JOB_RECORD_SUCCESS_AND_COMMIT, fence.success_params, prepare=False)
            except BaseException as exc:
                await _roll_back(conn)
                if isinstance(exc, psycopg.Error) and fence.refused(exc):
                    raise fence.stale() from None
                raise
        self.committed = True

    def transaction(self, orm: Any = None) -> Any:
        """The job's transaction: on the worker's connection, or on ``orm``'s (a SQLAlchemy session/connection).

        See :meth:`postbox.context.JobContext.transaction`.
        """
        if orm is None:
            return self._transaction()
        from postbox.sqlalchemy import JobTransaction

        return JobTransaction(self, orm)

    def atomic(self, using: str | None = None) -> Any:
        """The job's transaction on Django's connection ``using`` (:func:`postbox.django.job.atomic`)."""
        from postbox.django.job import atomic

        return atomic(self, using=using)

    async def upstream(self) -> Upstream:
        """This job's upstream jobs in its workflow, as they ended (:func:`postbox.workflow.read_upstream`)."""
        if self._conn is not None:  # inside ctx.transaction(): read in the job's own transaction
            return await read_upstream(self._conn, self.job_id)
        async with self._pool.connection() as conn:
            return await read_upstream(conn, self.job_id)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the run got (:mod:`postbox.progress`); callable from sync handlers' threads too.

        Checked at once (:class:`postbox.progress.ProgressError`); written to the job's
        row at most once a second, and its last value before the run's outcome
        (:meth:`flush_progress`). A failed write is logged, never the run's failure.
        """
        value = progress(done, total, note)
        loop = self._loop
        if loop is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._reported(value)
        else:
            loop.call_soon_threadsafe(self._reported, value)

    def _reported(self, value: Progress) -> None:
        if self._progress.report(value) and self._progress_write is None and self._loop is not None:
            self._progress_write = self._loop.create_task(self._write_progress(value))

    async def _write_progress(self, value: Progress) -> None:
        self._progress.wrote(value)
        try:
            async with self._pool.connection() as conn:
                await conn.execute(
                    sql.active().JOB_SET_PROGRESS,
                    {
                        "id": self.job_id,
                        "attempt": self.attempt,
                        "worker": self.worker_id,
                        "progress": orjson.dumps(value.as_json()).decode(),
                    },
                )
        except Exception as exc:  # progress is a view of the run, never its failure
            self.log.warning("writing the job's progress failed: %s: %s", type(exc).__name__, exc)
        else:
            if self._on_progress is not None:
                self._on_progress(self._job, value)
        finally:
            self._progress_write = None

    async def flush_progress(self) -> None:
        """Finish the write in flight and write the last value reported, if it is not written yet."""
        if self._progress_throttle is None:  # nothing was reported
            return
        if self._progress_write is not None:
            await asyncio.wait({self._progress_write})
        last = self._progress.due_at_end()
        if last is not None:
            await self._write_progress(last)

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Unpack[EnqueueOptions]
    ) -> int:
        if self._conn is None:
            raise RuntimeError("ctx.enqueue() runs inside `async with ctx.transaction()`")
        return await enqueue_async(self._conn, task, args, registry=self._registry, **options)


async def _roll_back(conn: AsyncConnection[Any]) -> None:
    """Roll back the job's transaction, if one is open, without masking the error being handled.

    A connection left busy (a query cut by a cancellation) or broken is the
    pool's to discard.
    """
    pgconn = conn.pgconn
    if pgconn.status != ConnStatus.OK or pgconn.transaction_status not in _OPEN:
        return
    try:
        await conn.rollback()
    except psycopg.Error as failed:
        logger.warning("rolling back the job's transaction failed: %s", failed)


_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)
