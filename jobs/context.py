"""What a handler receives as ``ctx``: the interface the worker implements.

Handlers are written against this protocol (the Stagedoor jobs are), so they
can be unit-tested with a small stand-in and run unchanged by the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from psycopg import AsyncConnection


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

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """Open the job's effect transaction.

        On entry the worker inserts ``processed_jobs(outbox_id)``; if the id was
        already there, :class:`jobs.errors.AlreadyProcessed` is raised and the
        body does not run.  The job's success commits in this same transaction.
        """
        ...

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        """Enqueue a follow-up job through the outbox, inside the open ``transaction()``."""
        ...

    @property
    def cancelled(self) -> bool:
        """True once an operator asked to cancel this running job (cooperative)."""
        ...
