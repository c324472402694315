"""Operations on jobs, queues, workers and dead letters: the logic behind the REST API and the admin CLI.

Every function takes an open psycopg ``AsyncConnection`` (and, where Redis is
read, an async Redis client) and returns plain dicts, so the API and the CLI
show the same thing. Destructive operations (cancel, pause, resume, requeue,
discard, purge) run in one transaction with their audit row, and log it.

Bad input raises a :class:`ControlError` subclass carrying an error code and the
HTTP status the API answers with; nothing is written when one is raised.

Exact and approximate numbers (queue stats):

- PostgreSQL counts (backlog, scheduled, queued, in_flight, retrying, dead,
  discarded, oldest_waiting_seconds) are **exact** at the moment of the query
  (one statement, one snapshot).
- Redis numbers (in_streams = XLEN summed over the queue's priority streams,
  stream_pending = delivered but not yet acknowledged entries) are
  **approximate**: read at a slightly different moment, and a stream may hold
  duplicate entries of one job (a republish) until they are absorbed.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.errors import PostboxError
from postbox.events import EventType, encode, event
from postbox.producer import JobRow
from postbox.settings import QUEUE_NAME_RE
from postbox.states import ALL_STATES
from postbox.streams import GROUP, events_channel, queue_streams

log = logging.getLogger("postbox.control")

MAX_PAGE = 500
ARCHIVE_STRIDE = 1_000_000  # attempts of an earlier life are stored as attempt - STRIDE x life
QUEUE_FULL_RETRY_AFTER = 5  # seconds a refused producer is told to wait
DEPTH_LOCK_CLASS = 0x7062  # first key of the per-queue depth locks (pg_advisory_xact_lock(class, hash))
MAX_BIGINT = 2**63 - 1


# --- errors ------------------------------------------------------------------------


class ControlError(PostboxError):
    """An operation refused; ``code`` and ``status`` are what the API answers."""

    code = "INVALID_REQUEST"
    status = 400

    def __init__(self, message: str, *, field: str | None = None, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.field = field
        self.details: dict[str, Any] = dict(details or {})
        if field is not None:
            self.details.setdefault("field", field)


class NotFoundError(ControlError):
    code = "NOT_FOUND"
    status = 404


class ConflictError(ControlError):
    code = "CONFLICT"
    status = 409


class ConfirmationRequiredError(ControlError):
    code = "CONFIRMATION_REQUIRED"
    status = 400


class QueueFullError(ControlError):
    code = "QUEUE_FULL"
    status = 429

    def __init__(self, message: str, *, retry_after: int, details: Mapping[str, Any] | None = None):
        super().__init__(message, details=details)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Actor:
    """Who runs a destructive operation (for the audit table and the log)."""

    name: str
    request_id: str | None = None


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


# --- pure helpers --------------------------------------------------------------------


def encode_cursor(last_id: int) -> str:
    """An opaque cursor: the page continues with ids below ``last_id``."""
    return base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    if cursor is None or cursor == "":
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, _, number = text.partition(":")
        value = int(number)
        if tag != "v1" or not 0 < value <= MAX_BIGINT or number != str(value):
            raise ValueError(text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ControlError("cursor is not one this API returned", field="cursor") from None
    return value


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ControlError(f"limit must be an integer 1-{MAX_PAGE}", field="limit")
    return limit


def check_queue_name(queue: str, field: str = "queue") -> str:
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise ControlError(f"invalid queue name {queue!r}: must match {QUEUE_NAME_RE.pattern}", field=field)
    return queue


def check_state(state: str) -> str:
    if state not in ALL_STATES:
        raise ControlError(f"unknown state {state!r}: one of {', '.join(ALL_STATES)}", field="state")
    return state


def check_text(value: str, field: str, max_len: int = 200) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_len or "\x00" in value:
        raise ControlError(f"{field} must be 1-{max_len} characters without NUL", field=field)
    return value


def check_job_id(job_id: int) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id <= MAX_BIGINT:
        raise ControlError(f"job id must be an integer 1-{MAX_BIGINT}", field="id")
    return job_id


def split_attempt(stored: int) -> tuple[int, int | None]:
    """(attempt, life) of a stored ``job_attempts.attempt``; life None = the current life."""
    if stored > 0:
        return stored, None
    life = (-stored) // ARCHIVE_STRIDE + 1
    return stored + ARCHIVE_STRIDE * life, life


def history_entries(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Attempt rows as the API shows them, in time order, each with its life (1 = first, before any requeue)."""
    parts = [(row, *split_attempt(int(row["attempt"]))) for row in rows]
    current = max((life for _, _, life in parts if life is not None), default=0) + 1
    out = []
    for row, attempt, life in parts:
        out.append(
            {
                "attempt": attempt,
                "life": current if life is None else life,
                "worker_id": row["worker_id"],
                "started_at": row["started_at"],
                "finished_at": row["finished_at"],
                "outcome": row["outcome"],
                "error_class": row["error_class"],
                "error": row["error"],
                "traceback": row.get("traceback"),
            }
        )
    out.sort(key=lambda e: (e["life"], e["attempt"]))
    return out


def job_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """The public fields of a job row (no args, no result)."""
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


# --- audit and events --------------------------------------------------------------


async def record_audit(
    conn: AsyncConnection[Any], actor: Actor, action: str, target: str, details: Mapping[str, Any] | None = None
) -> None:
    """Append one audit row (in the caller's transaction) and log it."""
    await conn.execute(
        sql.active().AUDIT_INSERT,
        {
            "actor": actor.name,
            "action": action,
            "target": target,
            "request_id": actor.request_id,
            "details": orjson.dumps(dict(details or {})).decode(),
        },
    )
    log.info(
        "audit %s %s",
        action,
        target,
        extra={"actor": actor.name, "action": action, "target": target, "request_id": actor.request_id},
    )


async def list_audit(conn: AsyncConnection[Any], *, limit: int = 50, cursor: str | None = None) -> Page:
    params = {"limit": check_limit(limit) + 1, "before": decode_cursor(cursor)}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().AUDIT_LIST, params)
        rows = await cur.fetchall()
    return _page(rows, limit)


async def publish_event(
    redis: Any, prefix: str, type_: EventType, *, job_id: int, queue: str, task: str, attempt: int = 0
) -> None:
    """PUBLISH one lifecycle event; best effort (a Redis outage never fails the operation)."""
    if redis is None:
        return
    try:
        await redis.publish(
            events_channel(prefix), encode(event(type_, job_id=job_id, queue=queue, task=task, attempt=attempt))
        )
    except Exception as exc:  # events are a view, never a dependency
        log.warning("event not published: %s", exc, extra={"outbox_id": job_id, "queue": queue, "task": task})


# --- jobs ------------------------------------------------------------------------


async def get_job(conn: AsyncConnection[Any], job_id: int) -> dict[str, Any]:
    """One job with its attempt history, args, and its result when kept; NotFoundError if unknown."""
    check_job_id(job_id)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_GET, {"id": job_id})
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
        await cur.execute(sql.active().JOB_ATTEMPT_LIST, {"id": job_id})
        history = await cur.fetchall()
    job = job_summary(row)
    job["args"] = row["args"]
    job["keep_result"] = row["keep_result"]
    job["result"] = row["result"] if row["keep_result"] else None
    job["history"] = history_entries(history)
    return job


def _listing(queue: str | None, task: str | None, cursor: str | None, limit: int, **extra: Any) -> dict[str, Any]:
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
) -> Page:
    """Jobs newest first, filtered; ``next_cursor`` continues the listing (None: no more)."""
    params = _listing(queue, task, cursor, limit, state=None if state is None else check_state(state))
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_LIST, params)
        rows = await cur.fetchall()
    return _page([job_summary(r) for r in rows], limit)


async def cancel_job(conn: AsyncConnection[Any], job_id: int, actor: Actor) -> dict[str, Any]:
    """Cancel per the contract: a waiting job ends now; a running one gets a cancel request.

    Returns ``{id, queue, task, state, attempts, cancel_requested}``; NotFoundError for an
    unknown job, ConflictError for a finished one.
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
        result = dict(row)
        result["cancel_requested"] = requested
        await record_audit(conn, actor, "job.cancel", f"job:{job_id}", {"state": row["state"]})
    return result


async def enqueue_job(
    conn: AsyncConnection[Any],
    row: JobRow,
    *,
    max_queue_depth: int = 0,
    before_commit: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[int, bool]:
    """Insert a prepared job (own transaction); (id, created). A live dedup key returns (existing id, False)."""
    job, job_id = await enqueue_and_read(conn, row, max_queue_depth=max_queue_depth, before_commit=before_commit)
    return job_id, job is not None


async def enqueue_and_read(
    conn: AsyncConnection[Any],
    row: JobRow,
    *,
    max_queue_depth: int = 0,
    before_commit: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[dict[str, Any] | None, int]:
    """Insert a prepared job (own transaction): (the new job, its id), or (None, the id of a live dedup key's job).

    The new job is the dict :func:`get_job` would return (no history yet), read
    back by the INSERT itself. With ``max_queue_depth`` > 0, a queue holding that
    many waiting jobs (pending, queued, retrying) refuses new ones with
    :class:`QueueFullError`; the count and the insert run under a per-queue
    transaction lock, so concurrent enqueues cannot overshoot the limit.
    ``before_commit(id)`` runs for a new job just before COMMIT: the API publishes
    its ``enqueued`` event there, so it always precedes the relay's ``published``
    (the relay cannot see the row before the commit).
    """
    params = row.params()
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if row.dedup_key is not None:
            await cur.execute(sql.active().JOB_GET_BY_DEDUP_KEY, params)
            found = await cur.fetchone()
            if found is not None:
                return None, int(next(iter(found.values())))
        if max_queue_depth > 0:
            await cur.execute(sql.active().QUEUE_LOCK_DEPTH, {"lock_class": DEPTH_LOCK_CLASS, "queue": row.queue})
            await cur.execute(sql.active().JOB_COUNT_WAITING, {"queue": row.queue, "limit": max_queue_depth})
            depth_row = await cur.fetchone()
            depth = int(next(iter(depth_row.values()))) if depth_row else 0
            if depth >= max_queue_depth:
                raise QueueFullError(
                    f"queue {row.queue!r} holds {depth} waiting jobs (limit {max_queue_depth})",
                    retry_after=QUEUE_FULL_RETRY_AFTER,
                    details={"queue": row.queue, "limit": max_queue_depth},
                )
        while True:
            await cur.execute(sql.active().JOB_INSERT_RETURNING_ROW, params)
            inserted = await cur.fetchone()
            if inserted is not None:
                if before_commit is not None:
                    await before_commit(int(inserted["id"]))
                return _new_job(inserted), int(inserted["id"])
            await cur.execute(sql.active().JOB_GET_BY_DEDUP_KEY, params)
            found = await cur.fetchone()
            if found is not None:
                return None, int(next(iter(found.values())))


def _new_job(row: Mapping[str, Any]) -> dict[str, Any]:
    job = job_summary(row)
    job["args"] = row["args"]
    job["keep_result"] = row["keep_result"]
    job["result"] = None
    job["history"] = []
    return job


# --- queues ---------------------------------------------------------------------


async def queue_stats(
    conn: AsyncConnection[Any],
    redis: Any,
    prefix: str,
    *,
    queue: str | None = None,
    extra_queues: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Stats of every known queue (or one); see the module doc for exact vs approximate."""
    if queue is not None:
        check_queue_name(queue)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_COUNT_BY_QUEUE, {"queue": queue})
        counts = {r["queue"]: r for r in await cur.fetchall()}
        await cur.execute(sql.active().QUEUE_LIST, {"queue": queue})
        control = {r["name"]: r for r in await cur.fetchall()}
        names = set(counts) | set(control)
        if queue is None:
            names |= {q for q in extra_queues if QUEUE_NAME_RE.match(q)}
        elif queue not in names:
            await cur.execute(sql.active().QUEUE_EXISTS, {"queue": queue})
            known = await cur.fetchone()
            if not (known and next(iter(known.values()))) and queue not in extra_queues:
                raise NotFoundError(f"queue {queue!r} not found", details={"queue": queue})
            names.add(queue)
    ordered = sorted(names)
    streams, redis_error = await stream_counts(redis, prefix, ordered)
    out = []
    for name in ordered:
        row = counts.get(name, {})
        ctl = control.get(name)
        in_streams, pending = streams.get(name, (None, None))
        out.append(
            {
                "queue": name,
                "paused": bool(ctl["paused"]) if ctl else False,
                "backlog": int(row.get("backlog") or 0),
                "scheduled": int(row.get("scheduled") or 0),
                "queued": int(row.get("queued") or 0),
                "in_flight": int(row.get("in_flight") or 0),
                "retrying": int(row.get("retrying") or 0),
                "dead": int(row.get("dead") or 0),
                "discarded": int(row.get("discarded") or 0),
                "oldest_waiting_seconds": row.get("oldest_waiting_seconds"),
                "in_streams": in_streams,
                "stream_pending": pending,
                "redis_error": redis_error,
            }
        )
    return out


async def stream_counts(
    redis: Any, prefix: str, queues: Sequence[str]
) -> tuple[dict[str, tuple[int, int]], str | None]:
    """{queue: (XLEN sum, XPENDING sum)} over each queue's priority streams; (_, error) if Redis fails."""
    if redis is None or not queues:
        return {}, None if redis is not None else "redis not configured"
    keys = [(q, key) for q in queues for key in queue_streams(prefix, q)]
    try:
        pipe = redis.pipeline(transaction=False)
        for _, key in keys:
            pipe.xlen(key)
            pipe.xpending(key, GROUP)
        replies = await pipe.execute(raise_on_error=False)
    except Exception as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    out: dict[str, tuple[int, int]] = {}
    for index, (q, _) in enumerate(keys):
        length, pending = replies[2 * index], replies[2 * index + 1]
        total, busy = out.get(q, (0, 0))
        total += length if isinstance(length, int) else 0
        busy += int(pending.get("pending", 0)) if isinstance(pending, dict) else 0
        out[q] = (total, busy)
    return out, None


async def set_paused(conn: AsyncConnection[Any], queue: str, paused: bool, actor: Actor) -> dict[str, Any]:
    """Pause or resume a queue (a queue with no row is active); audited."""
    check_queue_name(queue)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().QUEUE_SET_PAUSED, {"queue": queue, "paused": paused})
        row = await cur.fetchone()
        assert row is not None
        await record_audit(conn, actor, "queue.pause" if paused else "queue.resume", f"queue:{queue}")
    return {"queue": row["name"], "paused": row["paused"], "updated_at": row["updated_at"]}


# --- workers -----------------------------------------------------------------------


async def list_workers(
    conn: AsyncConnection[Any], *, heartbeat_interval: float, worker_id: str | None = None
) -> list[dict[str, Any]]:
    """Registered workers, newest first; ``stale`` when last seen over 3 heartbeat intervals ago."""
    if worker_id is not None:
        check_text(worker_id, "worker_id")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().WORKER_LIST, {"heartbeat": heartbeat_interval, "id": worker_id})
        rows = await cur.fetchall()
    out = []
    for row in rows:
        item = dict(row)
        item["queues"] = list(row["queues"] or [])
        item["stale"] = bool(row["stale"]) and row["stopped_at"] is None
        item["stopped"] = row["stopped_at"] is not None
        out.append(item)
    return out


async def get_worker(conn: AsyncConnection[Any], worker_id: str, *, heartbeat_interval: float) -> dict[str, Any]:
    found = await list_workers(conn, heartbeat_interval=heartbeat_interval, worker_id=worker_id)
    if not found:
        raise NotFoundError(f"worker {worker_id!r} not found", details={"id": worker_id})
    return found[0]


# --- dead letters --------------------------------------------------------------------


async def list_dead(
    conn: AsyncConnection[Any],
    *,
    queue: str | None = None,
    task: str | None = None,
    discarded: bool | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page:
    """Dead letters newest first (discarded ones too, flagged, unless ``discarded`` filters)."""
    params = _listing(queue, task, cursor, limit, discarded=discarded)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().JOB_LIST_DEAD, params)
        rows = await cur.fetchall()
    return _page([_dead_summary(r) for r in rows], limit)


async def get_dead(conn: AsyncConnection[Any], job_id: int) -> dict[str, Any]:
    """One dead letter: error class, message, args and attempt history."""
    job = await get_job(conn, job_id)
    if job["state"] != "dead":
        raise NotFoundError(
            f"job {job_id} is not a dead letter (state {job['state']})", details={"id": job_id, "state": job["state"]}
        )
    job["discarded"] = job["discarded_at"] is not None
    return job


async def requeue_dead(conn: AsyncConnection[Any], job_id: int, actor: Actor) -> dict[str, Any]:
    """Send a dead letter back through the outbox: pending, attempts reset, history kept; audited."""
    check_job_id(job_id)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await _lock_dead(cur, job_id)
        await cur.execute(sql.active().JOB_ATTEMPT_ARCHIVE, {"id": job_id})
        await cur.execute(sql.active().JOB_REQUEUE_DEAD, {"id": job_id})
        row = await cur.fetchone()
        assert row is not None
        await record_audit(conn, actor, "dlq.requeue", f"job:{job_id}")
    return dict(row)


async def discard_dead(conn: AsyncConnection[Any], job_id: int, actor: Actor) -> dict[str, Any]:
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
    return dict(row)


async def purge_dead(
    conn: AsyncConnection[Any],
    queue: str,
    *,
    older_than: float,
    confirm: bool,
    actor: Actor,
    discarded_only: bool = False,
) -> dict[str, Any]:
    """Delete dead letters of ``queue`` dead (or discarded) longer than ``older_than`` seconds.

    Without ``confirm`` nothing is deleted: ConfirmationRequiredError tells how many would be.
    """
    check_queue_name(queue)
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not 0 <= older_than <= 10**10:
        raise ControlError("older_than must be a number of seconds >= 0", field="older_than")
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
    return {"queue": queue, "purged": purged}


# --- internals ---------------------------------------------------------------------


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


def _dead_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    item = job_summary(row)
    item["discarded"] = row["discarded_at"] is not None
    return item


def _page(rows: Sequence[dict[str, Any]], limit: int) -> Page:
    items = list(rows[:limit])
    more = len(rows) > limit
    return Page(items=items, next_cursor=encode_cursor(int(items[-1]["id"])) if more and items else None)
