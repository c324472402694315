"""Jobs as operators see them: get (with history), list, cancel, enqueue.

Each function takes an open psycopg ``AsyncConnection`` and returns frozen
dataclasses (:class:`Job`, :class:`JobSummary`, :class:`CancelResult`). Cancel
runs in one transaction with its audit row. Bad input raises an error of
:mod:`postbox.app.services.errors`; nothing is written when one is raised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Unpack

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import (
    check_job_id,
    check_limit,
    check_queue_name,
    check_state,
    check_text,
    decode_cursor,
    encode_cursor,
)
from postbox.app.services.errors import ConflictError, NotFoundError
from postbox.app.services.results import Page, page
from postbox.producer import EnqueueOptions, Limits, TaskRef, enqueue_async
from postbox.registry import Registry

ARCHIVE_STRIDE = 1_000_000  # attempts of an earlier life are stored as attempt - STRIDE x life


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job; ``life`` counts from 1 (before any requeue)."""

    attempt: int
    life: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str | None
    error_class: str | None
    error: str | None
    traceback: str | None


@dataclass(frozen=True)
class JobSummary:
    """The public fields of a job row (no args, no result)."""

    id: int
    task: str
    queue: str
    priority: int
    state: str
    attempts: int
    max_attempts: int
    created_at: datetime
    available_at: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    cancel_requested_at: datetime | None
    discarded_at: datetime | None
    dedup_key: str | None
    worker_id: str | None
    last_error_class: str | None
    last_error: str | None


@dataclass(frozen=True)
class Job(JobSummary):
    """A job with its args, its result when kept, and its attempt history."""

    args: Any
    keep_result: bool
    result: Any
    history: list[Attempt]
    progress: dict[str, Any] | None  # the last ctx.progress() written: done, total, note, attempt, at


@dataclass(frozen=True)
class CancelResult:
    """A cancelled job (``cancel_requested``: it was running, its worker stops it)."""

    id: int
    queue: str
    task: str
    state: str
    attempts: int
    cancel_requested: bool


def split_attempt(stored: int) -> tuple[int, int | None]:
    """(attempt, life) of a stored ``job_attempts.attempt``; life None = the current life."""
    if stored > 0:
        return stored, None
    life = (-stored) // ARCHIVE_STRIDE + 1
    return stored + ARCHIVE_STRIDE * life, life


def history_entries(rows: Sequence[Mapping[str, Any]]) -> list[Attempt]:
    """Attempt rows as the API shows them, in time order, each with its life (1 = first, before any requeue)."""
    parts = [(row, *split_attempt(int(row["attempt"]))) for row in rows]
    current = max((life for _, _, life in parts if life is not None), default=0) + 1
    out = [
        Attempt(
            attempt=attempt,
            life=current if life is None else life,
            worker_id=row["worker_id"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            outcome=row["outcome"],
            error_class=row["error_class"],
            error=row["error"],
            traceback=row.get("traceback"),
        )
        for row, attempt, life in parts
    ]
    out.sort(key=lambda e: (e.life, e.attempt))
    return out


def summary_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`JobSummary` fields of a job row (its ``claimed_by`` shown as ``worker_id``)."""
    return {
        "id": row["id"],
        "task": row["task"],
        "queue": row["queue"],
        "priority": row["priority"],
        "state": row["state"],
        "attempts": row["attempts"],
        "max_attempts": row["max_attempts"],
        "created_at": row["created_at"],
        "available_at": row["available_at"],
        "published_at": row["published_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "expires_at": row["expires_at"],
        "cancel_requested_at": row["cancel_requested_at"],
        "discarded_at": row["discarded_at"],
        "dedup_key": row["dedup_key"],
        "worker_id": row["claimed_by"],
        "last_error_class": row["last_error_class"],
        "last_error": row["last_error"],
    }


def job_summary(row: Mapping[str, Any]) -> JobSummary:
    """The public fields of a job row (no args, no result)."""
    return JobSummary(**summary_fields(row))


def job_fields(row: Mapping[str, Any], history: list[Attempt]) -> dict[str, Any]:
    """The :class:`Job` fields of a job row (its result only when kept)."""
    return {
        **summary_fields(row),
        "args": row["args"],
        "keep_result": row["keep_result"],
        "result": row["result"] if row["keep_result"] else None,
        "history": history,
        "progress": row.get("progress"),
    }


async def get_job(conn: AsyncConnection[Any], job_id: int) -> Job:
    """One job with its attempt history, args, and its result when kept; NotFoundError if unknown."""
    return Job(**await read_job(conn, job_id))


async def read_job(conn: AsyncConnection[Any], job_id: int, *, with_history: bool = True) -> dict[str, Any]:
    """The :class:`Job` fields of one job (history left empty without ``with_history``); NotFoundError if unknown."""
    check_job_id(job_id)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_GET, {"id": job_id})
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
        history: list[Attempt] = []
        if with_history:
            await cur.execute(sql.active().JOB_ATTEMPT_LIST, {"id": job_id})
            history = history_entries(await cur.fetchall())
    return job_fields(row, history)


def listing(queue: str | None, task: str | None, cursor: str | None, limit: int, **extra: Any) -> dict[str, Any]:
    """Parameters of a newest-first listing: checked filters, the cursor, one row more than a page."""
    return {
        "queue": None if queue is None else check_queue_name(queue),
        "task": None if task is None else check_text(task, "task"),
        "before": decode_cursor(cursor),
        "limit": check_limit(limit) + 1,
        **extra,
    }


async def list_jobs(
    conn: AsyncConnection[Any],
    *,
    queue: str | None = None,
    task: str | None = None,
    state: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[JobSummary]:
    """Jobs newest first, filtered; ``next_cursor`` continues the listing (None: no more)."""
    params = listing(queue, task, cursor, limit, state=None if state is None else check_state(state))
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_LIST, params)
        rows = await cur.fetchall()
    return page([job_summary(r) for r in rows], limit, lambda j: j.id, encode_cursor)


async def cancel_job(conn: AsyncConnection[Any], job_id: int, actor: Actor) -> CancelResult:
    """Cancel per the contract: a waiting job ends now; a running one gets a cancel request.

    NotFoundError for an unknown job, ConflictError for a finished one.
    """
    check_job_id(job_id)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_CANCEL_WAITING, {"id": job_id})
        row = await cur.fetchone()
        requested = False
        if row is None:
            await cur.execute(sql.active().JOB_REQUEST_CANCEL, {"id": job_id})
            row = await cur.fetchone()
            requested = row is not None
        if row is None:
            await cur.execute(sql.active().JOB_GET_STATE, {"id": job_id})
            found = await cur.fetchone()
            if found is None:
                raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
            raise ConflictError(
                f"job {job_id} is already {found['state']}", details={"id": job_id, "state": found["state"]}
            )
        await record_audit(conn, actor, "job.cancel", f"job:{job_id}", {"state": row["state"]})
    return CancelResult(**row, cancel_requested=requested)


@dataclass(frozen=True)
class Enqueued:
    """An enqueued job, read back in its transaction; ``duplicate``: it was there already (dedup or unique key)."""

    job: Job
    duplicate: bool


async def enqueue(
    conn: AsyncConnection[Any],
    task: TaskRef,
    args: Mapping[str, Any] | None = None,
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    max_queue_depth: int = 0,
    before_commit: Callable[[Job], Awaitable[None]] | None = None,
    **options: Unpack[EnqueueOptions],
) -> Enqueued:
    """Enqueue one job in a transaction of its own and read it back.

    The insert is :func:`postbox.enqueue_async`'s (the one enqueue path: the
    same validation, dedup and unique keys, and the queue-depth limit with
    ``max_queue_depth``). ``before_commit(job)`` runs for a new job just before
    COMMIT: the API publishes its ``enqueued`` event there, so it always
    precedes the relay's ``published`` (the relay cannot see the row before the
    commit).
    """
    async with conn.transaction():
        job_id = await enqueue_async(
            conn, task, args, registry=registry, limits=limits, max_queue_depth=max_queue_depth, **options
        )
        job = Job(**await read_job(conn, job_id, with_history=job_id.duplicate))
        if before_commit is not None and not job_id.duplicate:
            await before_commit(job)
    return Enqueued(job=job, duplicate=job_id.duplicate)
