"""Queues as operators see them: stats, pause and resume.

Exact and approximate numbers (:class:`QueueStats`):

- PostgreSQL counts (backlog, scheduled, queued, in_flight, retrying, dead,
  discarded, oldest_waiting_seconds) are **exact** at the moment of the query
  (one statement, one snapshot).
- Redis numbers (in_streams = XLEN summed over the queue's priority streams,
  stream_pending = delivered but not yet acknowledged entries) are
  **approximate**: read at a slightly different moment, and a stream may hold
  duplicate entries of one job (a republish) until they are absorbed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import check_queue_name
from postbox.app.services.errors import NotFoundError
from postbox.settings import QUEUE_NAME_RE
from postbox.streams import GROUP, queue_streams


@dataclass(frozen=True)
class QueueStats:
    """One queue's counts (see the module doc for exact vs approximate); ``redis_error`` when Redis failed."""

    queue: str
    paused: bool
    backlog: int
    scheduled: int
    queued: int
    in_flight: int
    retrying: int
    dead: int
    discarded: int
    oldest_waiting_seconds: float | None
    in_streams: int | None
    stream_pending: int | None
    redis_error: str | None


@dataclass(frozen=True)
class QueueState:
    """A queue after pause or resume."""

    queue: str
    paused: bool
    updated_at: datetime


async def queue_stats(
    conn: AsyncConnection[Any],
    redis: Any,
    prefix: str,
    *,
    queue: str | None = None,
    extra_queues: Sequence[str] = (),
) -> list[QueueStats]:
    """Stats of every known queue (or one); NotFoundError for a queue nothing knows."""
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
    await end_read(conn)
    streams, redis_error = await stream_counts(redis, prefix, ordered)
    out = []
    for name in ordered:
        row = counts.get(name, {})
        ctl = control.get(name)
        in_streams, pending = streams.get(name, (None, None))
        out.append(
            QueueStats(
                queue=name,
                paused=bool(ctl["paused"]) if ctl else False,
                backlog=int(row.get("backlog") or 0),
                scheduled=int(row.get("scheduled") or 0),
                queued=int(row.get("queued") or 0),
                in_flight=int(row.get("in_flight") or 0),
                retrying=int(row.get("retrying") or 0),
                dead=int(row.get("dead") or 0),
                discarded=int(row.get("discarded") or 0),
                oldest_waiting_seconds=row.get("oldest_waiting_seconds"),
                in_streams=in_streams,
                stream_pending=pending,
                redis_error=redis_error,
            )
        )
    return out


async def end_read(conn: AsyncConnection[Any]) -> None:
    """End the read transaction before Redis is asked anything.

    Left open across a Redis stall, it holds its snapshot and its tables' share
    locks: a migration's ``ALTER TABLE`` queues behind it, and every statement on
    those tables queues behind the migration, until the API's idle-in-transaction
    bound ends the session.
    """
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.INTRANS:
        await conn.commit()


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


async def set_paused(conn: AsyncConnection[Any], queue: str, paused: bool, actor: Actor) -> QueueState:
    """Pause or resume a queue (a queue with no row is active); audited."""
    check_queue_name(queue)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().QUEUE_SET_PAUSED, {"queue": queue, "paused": paused})
        row = await cur.fetchone()
        assert row is not None
        await record_audit(conn, actor, "queue.pause" if paused else "queue.resume", f"queue:{queue}")
    return QueueState(queue=row["name"], paused=row["paused"], updated_at=row["updated_at"])
