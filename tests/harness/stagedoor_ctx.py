"""A small real-database :class:`jobs.context.JobContext` for calling Stagedoor handlers directly.

It does what the worker does around a handler, minus the stream: ``transaction()``
inserts ``processed_jobs(job id)`` first and raises :class:`AlreadyProcessed`
when the id is already there; ``enqueue`` goes through the outbox on that same
connection.  Each ``transaction()`` opens its own connection, so two contexts
run concurrently as two workers would.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from postbox.errors import AlreadyProcessed
from postbox.producer import enqueue_async

CLAIM_PROCESSED = (
    "INSERT INTO postbox.processed_jobs (outbox_id) VALUES (%(id)s) ON CONFLICT DO NOTHING RETURNING outbox_id"
)


@dataclass
class DbJobContext:
    database_url: str
    job_id: int
    task: str = "test"
    queue: str = "default"
    attempt: int = 1
    max_attempts: int = 5
    headers: Mapping[str, Any] = field(default_factory=dict)
    worker_id: str = "worker-testctx0"
    deadline: float | None = None
    log: logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.LoggerAdapter(logging.getLogger("tests.stagedoor"), {})
    )
    _conn: AsyncConnection[Any] | None = None

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        conn = await AsyncConnection.connect(self.database_url)
        try:
            async with conn.transaction():
                cur = await conn.execute(CLAIM_PROCESSED, {"id": self.job_id})
                if await cur.fetchone() is None:
                    raise AlreadyProcessed(self.job_id)
                self._conn = conn
                try:
                    yield conn
                finally:
                    self._conn = None
        finally:
            await conn.close()

    def transaction(self) -> Any:
        return self._transaction()

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        if self._conn is None:
            raise RuntimeError("ctx.enqueue needs an open ctx.transaction()")
        return await enqueue_async(self._conn, task, args, **options)

    @property
    def cancelled(self) -> bool:
        return False
