"""Read a job's result, or wait for it without polling.

``get_result(conn, job_id)`` reads it now; ``await wait_result(job_id,
timeout)`` registers as the job's waiter (a row in ``result_waiters``), LISTENs
on ``postbox_results`` and returns once the job is finished. Workers NOTIFY the
ids of the finished jobs that have a waiter (or belong to a workflow), one
notification per outcome batch, in the outcome's transaction; jobs nobody waits
for cost no NOTIFY (migration 0014). The waiter reads the job again half a
second after it registered and then every :data:`REREAD_INTERVAL` seconds: an
outcome whose check for waiters ran just before the registration committed
sends no NOTIFY, and its row is then read instead. A job that ended dead records its failure as
its result, so a waiter learns why: ``error_class`` and ``error`` are set.
A value is kept only for tasks (or enqueues) with ``keep_result``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection

from postbox import encryption, sql
from postbox.states import TERMINAL_STATES

RESULTS_CHANNEL = "postbox_results"
FIRST_REREAD = 0.5  # seconds after registering: an outcome racing the registration has committed by then
REREAD_INTERVAL = 5.0  # then: a safety net, not the way a result is normally learned


@dataclass(frozen=True)
class JobResult:
    job_id: int
    state: str
    value: Any = None  # the handler's return value (keep_result), else None
    error_class: str | None = None  # set when the job ended dead (or cancelled)
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"


def _from_row(job_id: int, row: tuple[Any, ...] | None) -> JobResult | None:
    if row is None:
        return None
    state, result, error_class, error = row
    if state == "dead" and isinstance(result, dict) and isinstance(result.get("error"), dict):
        failure = result["error"]
        return JobResult(job_id, state, None, failure.get("class") or error_class, failure.get("message") or error)
    if state == "succeeded":  # an encrypted task's result opened here, with this process's key
        return JobResult(job_id, state, encryption.open_result(job_id, result))
    if state in ("dead", "cancelled", "expired"):
        return JobResult(job_id, state, None, error_class, error)
    return JobResult(job_id, state)


def get_result(conn: Connection[Any], job_id: int) -> JobResult | None:
    """The job's state and result now (None: no such job). Runs one SELECT on ``conn``."""
    row = conn.execute(sql.active().JOB_GET_RESULT, {"id": job_id}).fetchone()
    return _from_row(job_id, row)


async def get_result_async(conn: AsyncConnection[Any], job_id: int) -> JobResult | None:
    cur = await conn.execute(sql.active().JOB_GET_RESULT, {"id": job_id})
    return _from_row(job_id, await cur.fetchone())


async def wait_result(job_id: int, timeout: float, *, database_url: str | None = None) -> JobResult:  # noqa: ASYNC109
    """Block until the job is finished (succeeded, dead, cancelled, expired); return its result.

    Raises ``LookupError`` for an unknown job and ``TimeoutError`` after ``timeout`` seconds.
    """
    if database_url is None:
        from postbox.settings import load_settings

        database_url = load_settings().require_database_url()
    deadline = time.monotonic() + timeout
    conn = await AsyncConnection.connect(database_url, autocommit=True, application_name="postbox-wait-result")
    waiter: int | None = None
    try:
        # Registered, then listening, then reading: an outcome that sees the registration NOTIFYs
        # after this LISTEN or commits before this read; one that does not is caught by a re-read.
        cur = await conn.execute(sql.active().RESULT_WAITER_ADD, {"job": job_id, "seconds": max(0.0, timeout)})
        row = await cur.fetchone()
        assert row is not None
        waiter = int(row[0])
        await conn.execute("LISTEN postbox_results")  # RESULTS_CHANNEL
        wanted = str(job_id)
        reread = FIRST_REREAD
        while True:
            result = await get_result_async(conn, job_id)
            if result is None:
                raise LookupError(f"no job {job_id}")
            if result.finished:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"job {job_id} not finished after {timeout}s (state {result.state})")
            async for note in conn.notifies(timeout=min(remaining, reread)):
                if wanted in note.payload.split(","):
                    break
            reread = REREAD_INTERVAL
    finally:
        try:
            if waiter is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(sql.active().RESULT_WAITER_REMOVE, {"id": waiter})
        finally:  # a cancel during the removal (a caller's own deadline) still closes the session
            await conn.close()
