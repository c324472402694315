"""Move waiting jobs: change the priority or the run time of pending, queued or retrying jobs.

One job (:func:`move_job`: refused with the reason when it cannot move) or
every job matching a filter (:func:`move_jobs`, at most ``limit`` per call).
Decided in PostgreSQL in one statement (``JOB_MOVE_WAITING``) under the rows'
locks, in one transaction with its audit row. A job that was published (its
entry already in the stream of its old priority) goes back through the outbox:
``pending``, unpublished, so the relay publishes it once to the stream of its
new priority when it is due; :func:`drop_old_entries` then deletes the old
entries (best effort). A worker that reads an old entry anyway claims the job
only if it is due and still waiting — so the job runs once, whichever entry
reaches a worker first. A running or finished job is never moved.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import pgarray, redis_conn, sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import check_job_id, check_queue_name, check_text
from postbox.app.services.errors import ConflictError, InvalidInputError, NotFoundError
from postbox.streams import stream_key

log = logging.getLogger(__name__)

WAITING_STATES = ("pending", "queued", "retrying")
MAX_MOVE = 10_000
MAX_DELAY = 366 * 86_400.0
MAX_IDS = 1_000


@dataclass(frozen=True)
class Moved:
    """A job moved: its new priority and due time, what they were, and whether it had been published."""

    id: int
    queue: str
    task: str
    state: str
    priority: int
    available_at: datetime
    old_priority: int
    old_available_at: datetime
    was_published: bool  # its entry in the old priority's stream is dropped; the relay publishes it again
    old_stream_id: str | None


@dataclass(frozen=True)
class Refused:
    """A job named by id that did not move, and why."""

    id: int
    state: str | None  # None: no such job
    reason: str


@dataclass(frozen=True)
class MoveResult:
    moved: list[Moved]
    refused: list[Refused]
    more: bool  # a filter moved ``limit`` jobs: there may be more, call again for the rest


def check_change(priority: int | None, run_at: datetime | None, delay: float | None) -> None:
    """Refuse a move that changes nothing, or gives a bad priority or time (nothing is written)."""
    if priority is None and run_at is None and delay is None:
        raise InvalidInputError("give a priority, a run_at or a delay to move jobs", field="priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9):
        raise InvalidInputError(f"priority must be an integer 0-9, got {priority!r}", field="priority")
    if run_at is not None and delay is not None:
        raise InvalidInputError("give run_at or delay, not both", field="delay")
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        raise InvalidInputError("run_at must be a datetime with a time zone", field="run_at")
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY
    ):
        raise InvalidInputError(f"delay must be seconds in 0..{MAX_DELAY:.0f}, got {delay!r}", field="delay")


async def move_jobs(
    conn: AsyncConnection[Any],
    actor: Actor,
    *,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    state: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    limit: int = 1000,
) -> MoveResult:
    """Move the waiting jobs named by ``ids`` and/or matching the filter (at least one of them given).

    Jobs named by id that did not move are in ``refused`` with the reason.
    """
    check_change(priority, run_at, delay)
    if ids is not None:
        if not ids or len(ids) > MAX_IDS:
            raise InvalidInputError(f"ids must name 1-{MAX_IDS} jobs", field="ids")
        for job_id in ids:
            check_job_id(job_id)
    if ids is None and queue is None and task is None and state is None:
        raise InvalidInputError("name jobs by ids, or filter them by queue, task or state", field="queue")
    if queue is not None:
        check_queue_name(queue)
    if task is not None:
        check_text(task, "task")
    if state is not None and state not in WAITING_STATES:
        raise InvalidInputError(f"state must be one of {', '.join(WAITING_STATES)}, got {state!r}", field="state")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_MOVE:
        raise InvalidInputError(f"limit must be an integer 1-{MAX_MOVE}", field="limit")
    params = {
        "ids": None if ids is None else pgarray.ints(sorted(set(ids))),
        "queue": queue,
        "task": task,
        "state": state,
        "priority": priority,
        "run_at": run_at,
        "delay": delay,
        "limit": limit,
    }
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_MOVE_WAITING, params)
        moved = sorted((Moved(**row) for row in await cur.fetchall()), key=lambda m: m.id)
        more = ids is None and len(moved) == limit
        refused: list[Refused] = []
        if ids is not None:
            done = {m.id for m in moved}
            left = sorted(set(ids) - done)
            if left:
                await cur.execute(sql.active().JOB_GET_STATES, {"ids": pgarray.ints(left)})
                states = {r["id"]: r["state"] for r in await cur.fetchall()}
                refused = [Refused(i, states.get(i), _reason(states.get(i), queue, task, state)) for i in left]
        target = f"job:{ids[0]}" if ids is not None and len(ids) == 1 else "jobs"
        details = {
            "priority": priority,
            "run_at": None if run_at is None else run_at.isoformat(),
            "delay": delay,
            "filter": {"queue": queue, "task": task, "state": state},
            "moved": len(moved),
            "ids": [m.id for m in moved][:100],
            "refused": [r.id for r in refused][:100],
        }
        if moved:
            await record_audit(conn, actor, "job.move", target, details)
    return MoveResult(moved=moved, refused=refused, more=more)


async def move_job(
    conn: AsyncConnection[Any],
    job_id: int,
    actor: Actor,
    *,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
) -> Moved:
    """Move one waiting job; NotFoundError for an unknown job, ConflictError (with the reason) when it cannot move."""
    check_job_id(job_id)
    result = await move_jobs(conn, actor, ids=[job_id], priority=priority, run_at=run_at, delay=delay)
    if result.moved:
        return result.moved[0]
    refusal = result.refused[0]
    if refusal.state is None:
        raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
    raise ConflictError(f"job {job_id} cannot move: {refusal.reason}", details={"id": job_id, "state": refusal.state})


async def drop_old_entries(redis: redis_conn.AnyRedis | None, prefix: str, moved: Sequence[Moved]) -> int:
    """Delete the stream entries the moved jobs had (best effort; returns how many Redis deleted).

    An entry already read by a worker is in its pending list: the claim then
    finds the job waiting (it runs once if it is due) or not due (acknowledged,
    not run); the relay's publish of the moved job is its one entry either way.
    """
    if redis is None:
        return 0
    deleted = 0
    for job in moved:
        if not job.was_published or not job.old_stream_id:
            continue
        try:
            deleted += int(await redis.xdel(stream_key(prefix, job.queue, job.old_priority), job.old_stream_id))
        except Exception as exc:  # Redis is a transport: the job is moved in PostgreSQL whatever happens here
            log.warning("dropping job %s's old stream entry failed: %s", job.id, type(exc).__name__)
    return deleted


def _reason(state: str | None, queue: str | None, task: str | None, wanted: str | None) -> str:
    if state is None:
        return "no such job"
    if state == "running":
        return "it is running: a started job cannot move"
    if state in ("succeeded", "dead", "cancelled", "expired"):
        return f"it is already {state}"
    if state in WAITING_STATES:
        return "it does not match the filter (queue, task, state) or is claimed by a worker right now"
    return f"it is {state}: only pending, queued or retrying jobs move"
