"""Operating workflows: list, get (jobs, states, edges), cancel, retry. Shared by the REST API and the CLI.

A workflow's status is computed from its jobs: ``running`` while one has not
ended, then ``succeeded``, ``failed`` (a job dead or expired) or ``cancelled``.
Cancel and retry are destructive: each writes an audit row in the transaction
that makes the change. Cancelling ends every job that has not started (their
dependents are cancelled by the release trigger in the same statement) and asks
the running ones to stop. Retrying gives the dead, cancelled and expired jobs a
fresh budget, recounts what every waiting job waits for from its upstream
jobs' states, and makes pending what waits for nothing: the workflow resumes
where it failed, and what succeeded does not run again (docs/workflows.md).
Requeueing one dead letter of a workflow (postbox.app.services.dlq) resumes, in
the same transaction, the jobs its death cancelled (:func:`resume_after_requeue`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import check_limit, check_text, decode_cursor, encode_cursor
from postbox.app.services.errors import ConflictError, InvalidInputError, NotFoundError
from postbox.app.services.results import Page, page
from postbox.workflow import InboundEdge, resumable

STATUSES = ("running", "succeeded", "failed", "cancelled")
MAX_BIGINT = 2**63 - 1


@dataclass(frozen=True)
class WorkflowSummary:
    id: int
    name: str
    status: str
    on_failure: str
    jobs: int
    counts: dict[str, int]  # jobs by state
    created_at: datetime
    finished_at: datetime | None  # when its last job ended (None while running)
    cancelled_at: datetime | None
    retried_at: datetime | None


@dataclass(frozen=True)
class WorkflowJob:
    id: int
    task: str
    queue: str
    state: str
    attempts: int
    max_attempts: int
    waiting_on: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    released_at: datetime | None
    last_error_class: str | None
    last_error: str | None


@dataclass(frozen=True)
class WorkflowEdge:
    parent: int
    child: int
    on_failure: str
    failure: dict[str, Any] | None


@dataclass(frozen=True)
class WorkflowDetail:
    workflow: WorkflowSummary
    jobs: list[WorkflowJob]
    edges: list[WorkflowEdge]


@dataclass(frozen=True)
class WorkflowChange:
    """What a cancel or a retry did: the jobs it ended (cancelled), asked to stop, or made run again."""

    workflow: WorkflowSummary
    cancelled: list[int]
    stopping: list[int]
    retried: list[int]


def check_workflow_id(workflow_id: int) -> int:
    if isinstance(workflow_id, bool) or not isinstance(workflow_id, int) or not 0 < workflow_id <= MAX_BIGINT:
        raise InvalidInputError(f"workflow id must be an integer 1-{MAX_BIGINT}", field="id")
    return workflow_id


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise InvalidInputError(f"unknown workflow status {status!r}: one of {', '.join(STATUSES)}", field="status")
    return status


def _summary(row: dict[str, Any]) -> WorkflowSummary:
    counts = {str(k): int(v) for k, v in (row["counts"] or {}).items()}
    return WorkflowSummary(
        id=row["id"],
        name=row["name"],
        status=row["status"],
        on_failure=row["on_failure"],
        jobs=row["jobs"],
        counts=counts,
        created_at=row["created_at"],
        finished_at=row["finished_at"] if row["status"] != "running" else None,
        cancelled_at=row["cancelled_at"],
        retried_at=row["retried_at"],
    )


async def _end_read(conn: AsyncConnection[Any]) -> None:
    if not conn.autocommit and conn.info.transaction_status != 0:
        await conn.commit()


async def list_workflows(
    conn: AsyncConnection[Any],
    *,
    status: str | None = None,
    name: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[WorkflowSummary]:
    """Workflows, newest first, with their jobs counted by state; filtered by status and name."""
    check_limit(limit)
    if status is not None:
        check_status(status)
    if name is not None:
        check_text(name, "name")
    before = decode_cursor(cursor)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            sql.active().WORKFLOW_LIST, {"before": before, "name": name, "status": status, "limit": limit + 1}
        )
        rows = await cur.fetchall()
    await _end_read(conn)
    return page([_summary(row) for row in rows], limit, lambda w: w.id, encode_cursor)


async def _get_summary(conn: AsyncConnection[Any], workflow_id: int) -> WorkflowSummary:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().WORKFLOW_GET, {"id": workflow_id})
        row = await cur.fetchone()
    if row is None:
        raise NotFoundError(f"workflow {workflow_id} not found", details={"id": workflow_id})
    return _summary(row)


async def get_workflow(conn: AsyncConnection[Any], workflow_id: int) -> WorkflowDetail:
    """A workflow with its jobs (states, counters, errors) and its edges (policies, recorded failures)."""
    check_workflow_id(workflow_id)
    statements = sql.active()
    summary = await _get_summary(conn, workflow_id)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(statements.JOB_LIST_OF_WORKFLOW, {"id": workflow_id})
        jobs = [WorkflowJob(**row) for row in await cur.fetchall()]
        await cur.execute(statements.WORKFLOW_EDGE_LIST, {"id": workflow_id})
        edges = [
            WorkflowEdge(
                parent=row["parent_id"],
                child=row["child_id"],
                on_failure=row["on_failure"],
                failure=orjson.loads(row["failure"]) if row["failure"] is not None else None,
            )
            for row in await cur.fetchall()
        ]
    await _end_read(conn)
    return WorkflowDetail(workflow=summary, jobs=jobs, edges=edges)


async def _lock(conn: AsyncConnection[Any], workflow_id: int) -> None:
    cur = await conn.execute(sql.active().WORKFLOW_LOCK, {"id": workflow_id})
    if await cur.fetchone() is None:
        raise NotFoundError(f"workflow {workflow_id} not found", details={"id": workflow_id})


async def cancel_workflow(conn: AsyncConnection[Any], workflow_id: int, actor: Actor) -> WorkflowChange:
    """Cancel every job of the workflow that has not started, ask its running jobs to stop; audited.

    A workflow whose jobs have all ended is refused (ConflictError): there is nothing to cancel.
    """
    check_workflow_id(workflow_id)
    statements = sql.active()
    async with conn.transaction():
        await _lock(conn, workflow_id)
        cancelled = [
            r[0] for r in await (await conn.execute(statements.JOB_CANCEL_OF_WORKFLOW, {"id": workflow_id})).fetchall()
        ]
        stopping = [
            r[0]
            for r in await (
                await conn.execute(statements.JOB_REQUEST_CANCEL_OF_WORKFLOW, {"id": workflow_id})
            ).fetchall()
        ]
        if not cancelled and not stopping:
            raise ConflictError(f"workflow {workflow_id} has ended: nothing to cancel", details={"id": workflow_id})
        await conn.execute(statements.WORKFLOW_SET_CANCELLED, {"id": workflow_id})
        await record_audit(
            conn,
            actor,
            "workflow.cancel",
            f"workflow:{workflow_id}",
            {"cancelled": len(cancelled), "stopping": len(stopping)},
        )
    return WorkflowChange(await _get_summary(conn, workflow_id), sorted(cancelled), sorted(stopping), [])


async def retry_workflow(conn: AsyncConnection[Any], workflow_id: int, actor: Actor) -> WorkflowChange:
    """Run the workflow's dead, cancelled and expired jobs again, and what waits on them; audited.

    A workflow with no such job is refused (ConflictError).
    """
    check_workflow_id(workflow_id)
    statements = sql.active()
    params = {"id": workflow_id}
    async with conn.transaction():
        await _lock(conn, workflow_id)
        await conn.execute(statements.JOB_LOCK_OF_WORKFLOW, params)
        reset = [r[0] for r in await (await conn.execute(statements.JOB_RESET_FAILED_OF_WORKFLOW, params)).fetchall()]
        if not reset:
            raise ConflictError(
                f"workflow {workflow_id} has no dead, cancelled or expired job to retry", details={"id": workflow_id}
            )
        await conn.execute(statements.WORKFLOW_EDGE_CLEAR_FAILURES, params)
        await conn.execute(statements.WORKFLOW_JOIN_RECOUNT, params)
        await conn.execute(statements.JOB_RECOUNT_WAITING_OF_WORKFLOW, params)
        await conn.execute(statements.WORKFLOW_SET_RETRIED, params)
        await conn.execute(statements.OUTBOX_NOTIFY)
        await record_audit(conn, actor, "workflow.retry", f"workflow:{workflow_id}", {"retried": len(reset)})
    return WorkflowChange(await _get_summary(conn, workflow_id), [], [], sorted(reset))


async def lock_for_requeue(conn: AsyncConnection[Any], job_id: int) -> int | None:
    """Inside a dead letter's requeue: the job's workflow id, its row and jobs locked as a retry locks them.

    ``None`` (nothing locked) for a job outside any workflow, or one that does not exist.
    """
    statements = sql.active()
    row = await (await conn.execute(statements.JOB_GET_WORKFLOW_ID, {"id": job_id})).fetchone()
    if row is None or row[0] is None:
        return None
    workflow_id = int(row[0])
    await _lock(conn, workflow_id)
    await conn.execute(statements.JOB_LOCK_OF_WORKFLOW, {"id": workflow_id})
    return workflow_id


async def resume_after_requeue(conn: AsyncConnection[Any], workflow_id: int, job_id: int) -> list[int]:
    """In the requeue's transaction, after the dead letter is pending again: resume what its death cancelled.

    Its end counts again for its dependents; the jobs its death cancelled (by
    ``cancel`` edges) wait again unless another failure still cancels them
    (:func:`postbox.workflow.resumable`); every waiting job of the workflow is
    recounted from its upstream jobs' states, as a retry does. Returns the
    resumed jobs' ids.
    """
    statements = sql.active()
    rows = await (await conn.execute(statements.JOB_LIST_CANCELLED_DOWNSTREAM, {"id": job_id})).fetchall()
    edges = [InboundEdge(child=r[0], parent=r[1], on_failure=r[2], parent_state=r[3]) for r in rows]
    chosen = resumable(job_id, edges)
    resumed: list[int] = []
    if chosen:
        cur = await conn.execute(statements.JOB_RESUME_CANCELLED, {"ids": chosen})
        resumed = sorted(r[0] for r in await cur.fetchall())
    await conn.execute(statements.JOB_CLEAR_RELEASED, {"id": job_id})
    await conn.execute(statements.WORKFLOW_EDGE_CLEAR_FAILURES_OF_PARENTS, {"ids": [job_id, *resumed]})
    params = {"id": workflow_id}
    await conn.execute(statements.WORKFLOW_JOIN_RECOUNT, params)
    await conn.execute(statements.JOB_RECOUNT_WAITING_OF_WORKFLOW, params)
    await conn.execute(statements.WORKFLOW_CLEAR_ENDED, params)
    return resumed


async def gauges(conn: AsyncConnection[Any]) -> tuple[int, list[tuple[str, int]]]:
    """For /metrics: workflows with a job not ended, and the waiting jobs by queue."""
    statements = sql.active()
    row = await (await conn.execute(statements.WORKFLOW_COUNT_ACTIVE)).fetchone()
    waiting = [
        (str(q), int(n)) for q, n in await (await conn.execute(statements.JOB_COUNT_WAITING_BY_QUEUE)).fetchall()
    ]
    await _end_read(conn)
    return (int(row[0]) if row else 0), waiting
