"""Runs taken over from lost runs, each alone in the worker: who crashed its worker is charged.

A worker that died while running several jobs cannot say which one killed it.
A job whose claim takes over a lost run (``Job.isolate``) runs here alone: no new
reads meanwhile (the capacity is blocked), and jobs claimed in the meantime
(takeovers do not wait) are held until the isolated runs are done. A job that
crashes its worker again while alone is the culprit, and the crash is charged
to it (the run is marked with ``sql.JOB_ATTEMPT_START_ISOLATED``, which
``JOB_CLAIM_ATTEMPTS`` reads). A long or hung handler must not freeze the
worker: past the visibility timeout the isolated job runs beside it (its crash,
if any, then charges nobody).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from psycopg_pool import AsyncConnectionPool

from postbox import sql
from postbox.worker.capacity import Capacity
from postbox.worker.delivery import Job

log = logging.getLogger(__name__)


class Isolation:
    """Runs taken-over jobs one at a time, each alone, and holds the jobs claimed meanwhile.

    ``start`` starts a job's run (its task in ``job.task``); ``running`` is the
    worker's map of claimed attempts (a job no longer in it is not started).
    The worker reports when its runs begin and end (:meth:`run_started` as the
    first of them starts, :meth:`run_ended` as the last ends) so this knows when
    nothing else runs.
    """

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        capacity: Capacity,
        stopping: asyncio.Event,
        running: Mapping[int, Job],
        start: Callable[[Job], None],
        worker_id: str,
        alone_within: float,
    ) -> None:
        self._pool = pool
        self._capacity = capacity
        self._stopping = stopping
        self._running = running
        self._start = start
        self._worker_id = worker_id
        self._alone_within = alone_within  # seconds to wait for the others to end (the visibility timeout)
        self._isolated: deque[Job] = deque()  # taken over from lost runs: each runs alone
        self._held: list[Job] = []  # claimed while isolated runs are pending
        self._task: asyncio.Task[None] | None = None
        self._nothing_executing = asyncio.Event()
        self._nothing_executing.set()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The isolated runs' task while there is one (cancelled at shutdown)."""
        return self._task

    def place(self, job: Job) -> bool:
        """Take ``job`` if it must wait: a takeover (run alone later), or a job claimed while one is pending.

        False: start it now.
        """
        if job.isolate:
            self._isolated.append(job)
            return True
        if self._task is not None or self._isolated:
            self._held.append(job)  # starts once the isolated runs are done
            return True
        return False

    def begin(self) -> None:
        """Start running the isolated jobs placed so far, unless already under way or stopping."""
        if self._isolated and self._task is None and not self._stopping.is_set():
            self._task = asyncio.create_task(self._run(), name="isolation")

    def run_started(self) -> None:
        """A run started while none ran."""
        self._nothing_executing.clear()

    def run_ended(self, executing: int) -> None:
        """A run ended; ``executing`` runs are left."""
        if executing == 0:
            self._nothing_executing.set()

    async def _run(self) -> None:
        self._capacity.block()
        try:
            while self._isolated and not self._stopping.is_set():
                alone = await self._wait_alone()
                if self._stopping.is_set():  # a stop came while waiting: start nothing new
                    break
                job = self._isolated.popleft()
                if self._running.get(job.id) is not job:
                    continue
                log.warning(
                    "running a job taken over from a lost run alone"
                    if alone
                    else "running a job taken over from a lost run beside others: they did not end in time",
                    extra={
                        "outbox_id": job.id,
                        "task": job.delivery.task,
                        "attempt": job.attempt,
                        "worker_id": self._worker_id,
                    },
                )
                try:
                    if alone:  # only a run alone is charged for a crash (JOB_CLAIM_ATTEMPTS)
                        async with self._pool.connection() as conn:
                            await conn.execute(
                                sql.active().JOB_ATTEMPT_START_ISOLATED,
                                {"id": job.id, "attempt": job.attempt, "worker": self._worker_id},
                            )
                except Exception:
                    log.exception("marking an isolated run failed; running it anyway", extra={"outbox_id": job.id})
                self._start(job)
                assert job.task is not None
                await asyncio.wait({job.task})
        finally:
            self._task = None
            self._capacity.unblock()
            held, self._held = self._held, []
            for job in held:
                if not self._stopping.is_set() and self._running.get(job.id) is job:
                    self._start(job)
            self.begin()

    async def _wait_alone(self) -> bool:
        """Wait until nothing else runs here; True if that came within the bound."""
        try:
            await asyncio.wait_for(self._nothing_executing.wait(), timeout=self._alone_within)
        except TimeoutError:
            return False
        return True
