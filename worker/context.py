"""The ``ctx`` a handler receives: the worker's implementation of :class:`jobs.context.JobContext`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from postbox import sql
from postbox.errors import AlreadyProcessed
from postbox.producer import enqueue_async
from postbox.registry import Registry
from postbox.worker.delivery import Job
from postbox.worker.outcomes import Outcome

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
        record_in_transaction: Callable[[AsyncConnection[Any], Job, Outcome], Any],
    ) -> None:
        delivery = job.delivery
        self._job = job
        self._pool = pool
        self._registry = registry
        self._record = record_in_transaction
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
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(sql.active().WORKER_INSERT_PROCESSED, {"id": self.job_id})
            if await cur.fetchone() is None:
                raise AlreadyProcessed(f"job {self.job_id} already committed its effects")
            self._conn = conn
            try:
                yield conn
            finally:
                self._conn = None
            # The body committed nothing yet: the success outcome joins the same
            # transaction. A refused fence rolls everything back.
            if not await self._record(conn, self._job, Outcome("succeeded", "succeeded")):
                raise StaleAttempt(f"job {self.job_id}: attempt {self.attempt} is no longer current")
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
