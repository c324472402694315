"""Dead letters as operators see them: list, get, requeue, discard, purge.

Requeue, discard and purge run in one transaction with their audit row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services import workflows
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import check_job_id, check_queue_name, encode_cursor
from postbox.app.services.errors import ConfirmationRequiredError, ConflictError, InvalidInputError, NotFoundError
from postbox.app.services.jobs import Job, JobSummary, listing, read_job, summary_fields
from postbox.app.services.results import Page, page


@dataclass(frozen=True)
class DeadLetterSummary(JobSummary):
    """A dead letter in a listing; ``discarded`` once an operator discarded it."""

    discarded: bool


@dataclass(frozen=True)
class DeadLetter(Job):
    """One dead letter with its args and attempt history."""

    discarded: bool


@dataclass(frozen=True)
class RequeueResult:
    """A dead letter sent back through the outbox."""

    id: int
    queue: str
    task: str
    state: str
    attempts: int
    resumed: list[int] = field(default_factory=list)  # a workflow's jobs its death had cancelled, waiting again


@dataclass(frozen=True)
class DiscardResult:
    """A dead letter marked discarded."""

    id: int
    queue: str
    task: str
    state: str
    attempts: int
    discarded_at: datetime


@dataclass(frozen=True)
class PurgeResult:
    queue: str
    purged: int


async def list_dead(
    conn: AsyncConnection[Any],
    *,
    queue: str | None = None,
    task: str | None = None,
    discarded: bool | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[DeadLetterSummary]:
    """Dead letters newest first (discarded ones too, flagged, unless ``discarded`` filters)."""
    params = listing(queue, task, cursor, limit, discarded=discarded)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_LIST_DEAD, params)
        rows = await cur.fetchall()
    items = [DeadLetterSummary(**summary_fields(r), discarded=r["discarded_at"] is not None) for r in rows]
    return page(items, limit, lambda j: j.id, encode_cursor)


async def get_dead(conn: AsyncConnection[Any], job_id: int) -> DeadLetter:
    """One dead letter: error class, message, args and attempt history."""
    job = await read_job(conn, job_id)
    if job["state"] != "dead":
        raise NotFoundError(
            f"job {job_id} is not a dead letter (state {job['state']})", details={"id": job_id, "state": job["state"]}
        )
    return DeadLetter(**job, discarded=job["discarded_at"] is not None)


async def requeue_dead(conn: AsyncConnection[Any], job_id: int, actor: Actor) -> RequeueResult:
    """Send a dead letter back through the outbox: pending, attempts reset, history kept; audited.

    A job of a workflow also resumes, in the same transaction, the jobs its death
    cancelled (``resumed``; postbox.app.services.workflows.resume_after_requeue).
    """
    check_job_id(job_id)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        workflow_id = await workflows.lock_for_requeue(conn, job_id)
        await _lock_dead(cur, job_id)
        await cur.execute(sql.active().JOB_ATTEMPT_ARCHIVE, {"id": job_id})
        await cur.execute(sql.active().JOB_REQUEUE_DEAD, {"id": job_id})
        row = await cur.fetchone()
        assert row is not None
        resumed = await workflows.resume_after_requeue(conn, workflow_id, job_id) if workflow_id is not None else []
        await record_audit(conn, actor, "dlq.requeue", f"job:{job_id}", {"resumed": resumed} if resumed else None)
    return RequeueResult(**row, resumed=resumed)


async def discard_dead(conn: AsyncConnection[Any], job_id: int, actor: Actor) -> DiscardResult:
    """Mark a dead letter discarded (kept, visible as discarded, until purged); audited."""
    check_job_id(job_id)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        locked = await _lock_dead(cur, job_id)
        if locked["discarded_at"] is not None:
            raise ConflictError(f"job {job_id} is already discarded", details={"id": job_id, "state": "dead"})
        await cur.execute(sql.active().JOB_DISCARD_DEAD, {"id": job_id})
        row = await cur.fetchone()
        assert row is not None
        await record_audit(conn, actor, "dlq.discard", f"job:{job_id}")
    return DiscardResult(**row)


async def purge_dead(
    conn: AsyncConnection[Any],
    queue: str,
    *,
    older_than: float,
    confirm: bool,
    actor: Actor,
    discarded_only: bool = False,
) -> PurgeResult:
    """Delete dead letters of ``queue`` dead (or discarded) longer than ``older_than`` seconds.

    Without ``confirm`` nothing is deleted: ConfirmationRequiredError tells how many would be.
    """
    check_queue_name(queue)
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not 0 <= older_than <= 10**10:
        raise InvalidInputError("older_than must be a number of seconds >= 0", field="older_than")
    params = {"queue": queue, "older_than": float(older_than), "discarded_only": bool(discarded_only)}
    async with conn.transaction(), conn.cursor() as cur:
        if not confirm:
            await cur.execute(sql.active().JOB_COUNT_PURGEABLE, params)
            found = await cur.fetchone()
            count = int(found[0]) if found else 0
            raise ConfirmationRequiredError(
                f"purge deletes {count} dead letters of queue {queue!r} for good: confirm it",
                field="confirm",
                details={"queue": queue, "would_purge": count},
            )
        await cur.execute(sql.active().JOB_PURGE_DEAD, params)
        row = await cur.fetchone()
        purged = int(row[0]) if row is not None else 0
        await record_audit(
            conn,
            actor,
            "dlq.purge",
            f"queue:{queue}",
            {"purged": purged, "older_than": float(older_than), "discarded_only": bool(discarded_only)},
        )
    return PurgeResult(queue=queue, purged=purged)


async def _lock_dead(cur: Any, job_id: int) -> dict[str, Any]:
    await cur.execute(sql.active().JOB_LOCK, {"id": job_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
    if row["state"] != "dead":
        raise ConflictError(
            f"job {job_id} is not a dead letter (state {row['state']})", details={"id": job_id, "state": row["state"]}
        )
    return dict(row)
