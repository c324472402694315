"""Enqueue jobs inside the caller's own PostgreSQL transaction.

``enqueue`` runs one INSERT on the connection it is given and never commits:
the job becomes visible when the caller commits, and vanishes if the caller
rolls back.  Validation happens first, in :func:`prepare`, which is pure and
raises a typed :class:`~jobs.errors.EnqueueError` before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

import orjson
from psycopg import AsyncConnection, Connection

from jobs import sql
from jobs.errors import (
    EnqueueError,
    InvalidArgsError,
    InvalidOptionError,
    PayloadTooLargeError,
    ScheduleConflictError,
)
from jobs.registry import Registry, check_max_attempts, check_priority, check_queue, default_registry

TaskRef = str | Callable[..., Any]
MAX_HEADERS_BYTES = 8192
MAX_DEDUP_KEY = 512


@dataclass(frozen=True)
class Limits:
    max_payload_bytes: int = 262_144


@lru_cache(maxsize=1)
def _limits_from_settings() -> Limits:
    from jobs.settings import load_settings

    return Limits(max_payload_bytes=load_settings().max_payload_bytes)


@dataclass(frozen=True, slots=True)
class JobRow:
    """A validated job, ready to insert (args and headers already JSON text)."""

    queue: str
    task: str
    args: str
    priority: int
    run_at: datetime | None
    delay: float
    max_attempts: int
    dedup_key: str | None
    headers: str
    expires_at: datetime | None
    timeout: float | None
    keep_result: bool

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "task": self.task,
            "args": self.args,
            "priority": self.priority,
            "run_at": self.run_at,
            "delay": self.delay,
            "max_attempts": self.max_attempts,
            "dedup_key": self.dedup_key,
            "headers": self.headers,
            "expires_at": self.expires_at,
            "timeout": self.timeout,
            "keep_result": self.keep_result,
        }


def prepare(
    task: TaskRef,
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    dedup_key: str | None = None,
    headers: Mapping[str, Any] | None = None,
    expires_at: datetime | None = None,
    keep_result: bool | None = None,
    registry: Registry | None = None,
    limits: Limits | None = None,
) -> JobRow:
    """Validate one job; raise a typed error, write nothing."""
    spec = (registry or default_registry).resolve(task)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise InvalidArgsError(f"args must be a JSON object (a mapping), got {type(args).__name__}", field="args")
    validated = spec.validate_args(args)
    try:
        payload = orjson.dumps(validated)
    except TypeError as exc:
        raise InvalidArgsError(f"args are not JSON-serialisable: {exc}", field="args") from None
    limit = (limits or _limits_from_settings()).max_payload_bytes
    if len(payload) > limit:
        raise PayloadTooLargeError(
            f"args are {len(payload)} bytes, over the {limit}-byte limit",
            field="args",
            details={"size": len(payload), "limit": limit},
        )
    if delay is not None and run_at is not None:
        raise ScheduleConflictError("give delay or run_at, not both", field="delay")
    delay_s = _delay_seconds(delay)
    if run_at is not None:
        _check_aware(run_at, "run_at")
    if expires_at is not None:
        _check_aware(expires_at, "expires_at")
    header_text = _headers_json(headers)
    if dedup_key is not None and (not isinstance(dedup_key, str) or not 0 < len(dedup_key) <= MAX_DEDUP_KEY):
        raise InvalidOptionError(f"dedup_key must be a string of 1-{MAX_DEDUP_KEY} characters", field="dedup_key")
    return JobRow(
        queue=check_queue(queue if queue is not None else spec.queue),
        task=spec.name,
        args=payload.decode(),
        priority=check_priority(priority if priority is not None else spec.priority),
        run_at=run_at,
        delay=delay_s,
        max_attempts=check_max_attempts(max_attempts if max_attempts is not None else spec.max_attempts),
        dedup_key=dedup_key,
        headers=header_text,
        expires_at=expires_at,
        timeout=spec.timeout,
        keep_result=spec.keep_result if keep_result is None else bool(keep_result),
    )


def enqueue(conn: Connection[Any], task: TaskRef, args: Mapping[str, Any] | None = None, **options: Any) -> int:
    """Insert one job in ``conn``'s current transaction; return its outbox id.

    Options: queue, priority, delay (seconds or timedelta), run_at (aware
    datetime), max_attempts, dedup_key, headers, expires_at, keep_result.
    With a dedup key that a live job of the same queue holds, nothing is
    inserted and that job's id is returned.
    """
    row = prepare(task, args, **options)
    params = row.params()
    with conn.cursor() as cur:
        while True:
            found = cur.execute(sql.INSERT_JOB, params).fetchone()
            if found is None and row.dedup_key is not None:
                found = cur.execute(sql.SELECT_DEDUP, params).fetchone()
            if found is not None:
                return int(found[0])
            # The key's holder was deleted between our two statements: insert again.


async def enqueue_async(
    conn: AsyncConnection[Any], task: TaskRef, args: Mapping[str, Any] | None = None, **options: Any
) -> int:
    """The async twin of :func:`enqueue`, on a psycopg ``AsyncConnection``."""
    row = prepare(task, args, **options)
    params = row.params()
    async with conn.cursor() as cur:
        while True:
            await cur.execute(sql.INSERT_JOB, params)
            found = await cur.fetchone()
            if found is None and row.dedup_key is not None:
                await cur.execute(sql.SELECT_DEDUP, params)
                found = await cur.fetchone()
            if found is not None:
                return int(found[0])


def prepare_many(items: Iterable[Mapping[str, Any]], **common: Any) -> list[JobRow]:
    """Validate every item first (each a dict with ``task``, ``args`` and options)."""
    rows = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or "task" not in item:
            raise InvalidOptionError(f"item {index}: each item is a mapping with a 'task' key", field=f"items.{index}")
        options = {k: v for k, v in item.items() if k not in ("task", "args")}
        try:
            rows.append(prepare(item["task"], item.get("args"), **common, **options))
        except EnqueueError as exc:
            exc.args = (f"item {index}: {exc.args[0]}",)
            exc.details.setdefault("index", index)
            raise
        except TypeError as exc:
            raise InvalidOptionError(f"item {index}: {exc}", field=f"items.{index}") from None
    return rows


def _bulk_params(rows: Sequence[JobRow]) -> dict[str, list[Any]]:
    return {
        "queue": [r.queue for r in rows],
        "task": [r.task for r in rows],
        "args": [r.args for r in rows],
        "priority": [r.priority for r in rows],
        "run_at": [r.run_at for r in rows],
        "delay": [r.delay for r in rows],
        "max_attempts": [r.max_attempts for r in rows],
        "dedup_key": [r.dedup_key for r in rows],
        "headers": [r.headers for r in rows],
        "expires_at": [r.expires_at for r in rows],
        "timeout": [r.timeout for r in rows],
        "keep_result": [r.keep_result for r in rows],
    }


def _assign_ids(
    rows: Sequence[JobRow], inserted: list[tuple[int, str, str | None]], existing: dict[tuple[str, str], int]
) -> list[int]:
    """Map returned ids back to input order.

    Rows are inserted in input order and identity values rise monotonically
    within one statement, so unkeyed rows take the inserted unkeyed ids in
    ascending order; keyed rows are matched by (queue, key).
    """
    keyed = dict(existing)
    unkeyed: list[int] = []
    for job_id, queue, key in sorted(inserted):
        if key is None:
            unkeyed.append(job_id)
        else:
            keyed[(queue, key)] = job_id
    out: list[int] = []
    position = 0
    for row in rows:
        if row.dedup_key is None:
            out.append(unkeyed[position])
            position += 1
        else:
            out.append(keyed[(row.queue, row.dedup_key)])
    return out


def _missing_keys(rows: Sequence[JobRow], inserted: list[tuple[int, str, str | None]]) -> dict[str, list[str]]:
    got = {(q, k) for _, q, k in inserted if k is not None}
    missing = {(r.queue, r.dedup_key) for r in rows if r.dedup_key is not None and (r.queue, r.dedup_key) not in got}
    return {"queue": [q for q, _ in missing], "dedup_key": [k for _, k in missing if k is not None]}


def _copy_rows(rows: Sequence[JobRow], ids: list[tuple[int, datetime]]) -> Iterable[tuple[Any, ...]]:
    """COPY rows for jobs without dedup keys; ``ids`` are (id, database now()) pairs."""
    now = ids[0][1]
    for (job_id, _), row in zip(sorted(ids), rows, strict=True):
        available = row.run_at if row.run_at is not None else now + timedelta(seconds=row.delay)
        yield (
            job_id, row.queue, row.task, row.args, row.priority, available, row.max_attempts,
            row.headers, row.expires_at, row.timeout, row.keep_result,
        )  # fmt: skip


def enqueue_many(conn: Connection[Any], items: Iterable[Mapping[str, Any]], **common: Any) -> list[int]:
    """Insert many jobs in one statement in ``conn``'s transaction; ids in input order.

    Without dedup keys the statement is a COPY; with any, an INSERT ... ON CONFLICT.
    """
    rows = prepare_many(items, **common)
    if not rows:
        return []
    if all(row.dedup_key is None for row in rows):
        with conn.cursor() as cur:
            ids = cur.execute(sql.NEXT_JOB_IDS, {"n": len(rows)}).fetchall()
            with cur.copy(sql.COPY_JOBS) as copy:
                for values in _copy_rows(rows, ids):
                    copy.write_row(values)
        return sorted(job_id for job_id, _ in ids)
    with conn.cursor() as cur:
        inserted = cur.execute(sql.INSERT_JOBS_BULK, _bulk_params(rows)).fetchall()
        missing = _missing_keys(rows, inserted)
        existing: dict[tuple[str, str], int] = {}
        if missing["queue"]:
            for job_id, queue, key in cur.execute(sql.SELECT_DEDUP_MANY, missing).fetchall():
                existing[(queue, key)] = job_id
    return _assign_ids(rows, inserted, existing)


async def enqueue_many_async(
    conn: AsyncConnection[Any], items: Iterable[Mapping[str, Any]], **common: Any
) -> list[int]:
    """The async twin of :func:`enqueue_many`."""
    rows = prepare_many(items, **common)
    if not rows:
        return []
    if all(row.dedup_key is None for row in rows):
        async with conn.cursor() as cur:
            await cur.execute(sql.NEXT_JOB_IDS, {"n": len(rows)})
            ids = await cur.fetchall()
            async with cur.copy(sql.COPY_JOBS) as copy:
                for values in _copy_rows(rows, ids):
                    await copy.write_row(values)
        return sorted(job_id for job_id, _ in ids)
    async with conn.cursor() as cur:
        await cur.execute(sql.INSERT_JOBS_BULK, _bulk_params(rows))
        inserted = await cur.fetchall()
        missing = _missing_keys(rows, inserted)
        existing: dict[tuple[str, str], int] = {}
        if missing["queue"]:
            await cur.execute(sql.SELECT_DEDUP_MANY, missing)
            for job_id, queue, key in await cur.fetchall():
                existing[(queue, key)] = job_id
    return _assign_ids(rows, inserted, existing)


def _delay_seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise ScheduleConflictError(f"delay must be seconds or a timedelta, got {delay!r}", field="delay")
    if not math.isfinite(seconds) or seconds < 0:
        raise ScheduleConflictError(f"delay must be a finite number >= 0, got {delay!r}", field="delay")
    return seconds


def _check_aware(value: datetime, field: str) -> None:
    if not isinstance(value, datetime):
        raise ScheduleConflictError(f"{field} must be a datetime", field=field)
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleConflictError(f"{field} must be timezone-aware", field=field)


def _headers_json(headers: Mapping[str, Any] | None) -> str:
    if headers is None:
        return "{}"
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) for k in headers):
        raise InvalidOptionError("headers must be a mapping with string keys", field="headers")
    try:
        text = orjson.dumps(dict(headers))
    except TypeError as exc:
        raise InvalidOptionError(f"headers are not JSON-serialisable: {exc}", field="headers") from None
    if len(text) > MAX_HEADERS_BYTES:
        raise InvalidOptionError(f"headers are over {MAX_HEADERS_BYTES} bytes", field="headers")
    return text.decode()
