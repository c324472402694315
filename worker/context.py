"""The ``ctx`` a handler receives: the worker's implementation of :class:`jobs.context.JobContext`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
import psycopg
from psycopg import AsyncConnection, AsyncTransaction
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool

from postbox import sql
from postbox.errors import AlreadyProcessed
from postbox.producer import enqueue_async
from postbox.registry import Registry
from postbox.worker.delivery import Job

logger = logging.getLogger("postbox.job")


class StaleAttempt(BaseException):
    """This run's attempt is no longer the job's current one (the fence refused its outcome).

    Raised on leaving ``ctx.transaction()``: the transaction rolls back, so a
    stale run's effects never commit; the newer attempt does the work.
    """


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
    ) -> None:
        delivery = job.delivery
        self._job = job
        self._pool = pool
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
        self.log: logging.LoggerAdapter[logging.Logger] = logging.LoggerAdapter(
            logger,
            {
                "outbox_id": self.job_id,
                "task": self.task,
                "queue": self.queue,
                "attempt": self.attempt,
                "worker_id": worker_id,
            },
        )

    @property
    def headers(self) -> Mapping[str, Any]:
        if self._headers is None:
            value = orjson.loads(self._job.delivery.headers or "{}")
            self._headers = value if isinstance(value, dict) else {}
        return self._headers

    @property
    def cancelled(self) -> bool:
        return self._job.cancel_requested

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        if self._entered:
            raise RuntimeError("ctx.transaction() may be entered once per run")
        self._entered = True
        statements = sql.active()
        async with self._pool.connection() as conn:
            # Two round trips besides the body's own statements, each a short pipeline
            # (the body itself runs on the connection in its normal mode):
            # 1. BEGIN + the processed row. The row is inserted before the body runs: it
            #    is the lock a concurrent run of the same job waits on, to then find it
            #    committed (AlreadyProcessed) or rolled back (and insert it itself).
            tx = AsyncTransaction(conn)
            try:
                async with conn.pipeline():
                    await tx.__aenter__()
                    cur = await conn.execute(statements.WORKER_INSERT_PROCESSED, {"id": self.job_id})
                fresh = await cur.fetchone() is not None
            except BaseException as exc:
                await _roll_back(conn, tx, exc)
                raise
            if not fresh:
                already = AlreadyProcessed(f"job {self.job_id} already committed its effects")
                await _roll_back(conn, tx, already)
                raise already
            self._conn = conn
            try:
                yield conn
            except BaseException as exc:
                self._conn = None
                if await tx.__aexit__(type(exc), exc, exc.__traceback__):
                    return  # psycopg.Rollback raised by the body: rolled back, swallowed
                raise
            self._conn = None
            # 2. The success outcome (fenced) + COMMIT. A refused fence raises in the
            #    outcome statement: PostgreSQL skips the COMMIT queued behind it, and the
            #    body's effects roll back with the processed row.
            params = {"id": self.job_id, "worker": self.worker_id, "attempt": self.attempt}
            try:
                async with conn.pipeline():
                    await conn.execute(statements.WORKER_RECORD_SUCCESS_IN_TRANSACTION, params)
                    await tx.__aexit__(None, None, None)
            except BaseException as exc:
                await _roll_back(conn, tx, exc)
                if isinstance(exc, psycopg.Error) and exc.sqlstate == sql.STALE_ATTEMPT_SQLSTATE:
                    raise StaleAttempt(f"job {self.job_id}: attempt {self.attempt} is no longer current") from None
                raise
        self.committed = True

    def transaction(self) -> Any:
        return self._transaction()

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        if self._conn is None:
            raise RuntimeError("ctx.enqueue() runs inside `async with ctx.transaction()`")
        options.setdefault("registry", self._registry)
        return await enqueue_async(self._conn, task, args, **options)


async def _roll_back(conn: AsyncConnection[Any], tx: AsyncTransaction, exc: BaseException) -> None:
    """End the job's transaction after ``exc``: roll back whatever is open, never mask ``exc``."""
    if tx.status is tx.Status.ACTIVE:
        await tx.__aexit__(type(exc), exc, exc.__traceback__)  # warns rather than raises on a failed rollback
        return
    # The COMMIT was queued but an earlier statement of its pipeline failed: PostgreSQL
    # skipped it and the transaction is aborted.
    pgconn = conn.pgconn
    if pgconn.status == ConnStatus.OK and pgconn.transaction_status == TransactionStatus.INERROR:
        try:
            await conn.rollback()
        except psycopg.Error as failed:
            logger.warning("rollback after %s failed: %s", type(exc).__name__, failed)
