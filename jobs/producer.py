"""Enqueue jobs inside the caller's own PostgreSQL transaction.

``enqueue`` runs one INSERT on the connection it is given and never commits:
the job becomes visible when the caller commits, and vanishes if the caller
rolls back.  Validation happens first, in :func:`prepare`, which is pure and
raises a typed :class:`~postbox.errors.EnqueueError` before anything is written.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any, NamedTuple, ParamSpec, TypedDict, TypeVar, Unpack, cast, get_args

import orjson
from psycopg import AsyncConnection, Connection
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from postbox import connections, encryption, fairness, revision, sql, tracing
from postbox.connections import AsyncTarget, SyncTarget
from postbox.errors import (
    ArgsOutOfRangeError,
    EnqueueError,
    InvalidArgsError,
    InvalidOptionError,
    PayloadTooLargeError,
    QueueFullError,
    ScheduleConflictError,
)
from postbox.ids import take as take_id
from postbox.ids import take_async as take_id_async
from postbox.registry import Registry, TaskSpec, check_max_attempts, check_priority, check_queue, default_registry

TaskRef = str | Callable[..., Any]
P = ParamSpec("P")
R = TypeVar("R")
MAX_HEADERS_BYTES = 8192
MAX_DEDUP_KEY = 512
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# In serialised args, the traces of a number to check: pydantic writes NaN and
# infinities as null, and an integer outside 64 bits has at least 19 digits.
SUSPECT_NUMBER = re.compile(rb"null|\d{19}")


class JobId(int):
    """What ``enqueue()`` returns: the job's outbox id (an ``int``), and whether it was already there.

    ``duplicate`` is True when nothing was inserted: a job holding the same
    dedup key (its queue's), or the same unique key (its task's rule,
    docs/unique-jobs.md), was found, and this is its id.
    """

    duplicate: bool

    def __new__(cls, value: int, duplicate: bool = False) -> JobId:
        job_id = super().__new__(cls, value)
        job_id.duplicate = duplicate
        return job_id


class EnqueueOptions(TypedDict, total=False):
    """The options of one job, as ``enqueue()``, ``enqueue_async()``, ``ctx.enqueue()``, a task's
    ``.options()`` and ``enqueue_many()`` (common to every item) take them; the type checker checks
    each name and type at every call site. None (or leaving one out) takes the task's default.

    ``delay`` is seconds (or a timedelta) from the database's now; ``run_at`` and
    ``expires_at`` are timezone-aware datetimes; ``dedup_key`` is scoped per queue;
    ``headers`` is a JSON object (with the trace context added).
    """

    queue: str | None
    priority: int | None
    delay: float | timedelta | None
    run_at: datetime | None
    max_attempts: int | None
    dedup_key: str | None
    headers: Mapping[str, Any] | None
    expires_at: datetime | None
    keep_result: bool | None


OPTION_NAMES = EnqueueOptions.__required_keys__ | EnqueueOptions.__optional_keys__
QUEUE_FULL_RETRY_AFTER = 5  # seconds a producer refused for a full queue is told to wait
DEPTH_LOCK_CLASS = 0x7062  # first key of the per-queue depth locks (pg_advisory_xact_lock(class, hash))
Step = tuple[Any, Mapping[str, Any]]  # a statement to send and its parameters; the reply's first row comes back


@dataclass(frozen=True)
class Limits:
    max_payload_bytes: int = 262_144


@lru_cache(maxsize=1)
def _limits_from_settings() -> Limits:
    from postbox.settings import load_settings

    return Limits(max_payload_bytes=load_settings().max_payload_bytes)


class JobRow(NamedTuple):
    """A validated job, ready to insert (args and headers already JSON text).

    A named tuple: immutable, and built in half the time of a frozen dataclass,
    which counts when ``enqueue_many`` makes ten thousand of them.
    """

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
    unique_rule: str | None = None  # the task's uniqueness rule as JSON (postbox.unique), None: no rule
    unique_key: str | None = None  # set by insert_steps() (the key's lock), written with the job

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
            "unique_key": self.unique_key,
        }


def prepare(
    task: TaskRef,
    args: Mapping[str, Any] | None = None,
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    **options: Unpack[EnqueueOptions],
) -> JobRow:
    """Validate one job; raise a typed error, write nothing."""
    spec = (registry or default_registry).resolve(task)
    limit = (limits or _limits_from_settings()).max_payload_bytes
    payload = _args_payload(spec, args, limit)
    return _with_args(_template(spec, **options), payload)


def _args_payload(spec: TaskSpec, args: Mapping[str, Any] | None, limit: int) -> str:
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise InvalidArgsError(f"args must be a JSON object (a mapping), got {type(args).__name__}", field="args")
    _check_exact(spec, args)
    payload = spec.args_json(args)
    if SUSPECT_NUMBER.search(payload):
        _check_numbers(spec.args_model.model_validate(dict(args)).model_dump())  # valid: args_json passed
    if len(payload) > limit:
        raise PayloadTooLargeError(
            f"args are {len(payload)} bytes, over the {limit}-byte limit",
            field="args",
            details={"size": len(payload), "limit": limit},
        )
    return _sealed(spec, payload)


def _sealed(spec: TaskSpec, payload: bytes) -> str:
    """The args as stored: sealed for an encrypted task (postbox.encryption), else as they are."""
    if not spec.encrypted:
        return payload.decode()
    return encryption.keyring().seal(spec.name, payload)


def _template(spec: TaskSpec, **options: Unpack[EnqueueOptions]) -> JobRow:
    """Everything of a job but its args, checked (args is left empty)."""
    if not options.keys() <= OPTION_NAMES:  # a call the type checker did not see
        unknown = sorted(options.keys() - OPTION_NAMES)[0]
        raise InvalidOptionError(
            f"unknown enqueue option {unknown!r}: one of {', '.join(sorted(OPTION_NAMES))}", field=unknown
        )
    queue, priority, max_attempts = options.get("queue"), options.get("priority"), options.get("max_attempts")
    delay, run_at, expires_at = options.get("delay"), options.get("run_at"), options.get("expires_at")
    dedup_key, headers, keep_result = options.get("dedup_key"), options.get("headers"), options.get("keep_result")
    if delay is not None and run_at is not None:
        raise ScheduleConflictError("give delay or run_at, not both", field="delay")
    delay_s = _delay_seconds(delay)
    if delay is None and run_at is None and spec.unique is not None and spec.unique.debounce is not None:
        delay_s = spec.unique.period or 0.0  # a debounced key's job runs after its window (postbox.unique.debounce)
    if run_at is not None:
        _check_aware(run_at, "run_at")
    if expires_at is not None:
        _check_aware(expires_at, "expires_at")
    header_text = _headers_json(tracing.with_trace_context(headers))
    if dedup_key is not None and (not isinstance(dedup_key, str) or not 0 < len(dedup_key) <= MAX_DEDUP_KEY):
        raise InvalidOptionError(f"dedup_key must be a string of 1-{MAX_DEDUP_KEY} characters", field="dedup_key")
    return JobRow(
        queue=check_queue(queue if queue is not None else spec.queue),
        task=spec.name,
        args="",
        priority=check_priority(priority if priority is not None else spec.priority),
        run_at=run_at,
        delay=delay_s,
        max_attempts=check_max_attempts(max_attempts if max_attempts is not None else spec.max_attempts),
        dedup_key=dedup_key,
        headers=header_text,
        expires_at=expires_at,
        timeout=spec.timeout,
        keep_result=spec.keep_result if keep_result is None else bool(keep_result),
        unique_rule=spec.unique_rule,
    )


def _unmigrated(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` raising :class:`~postbox.errors.SchemaOutdatedError` (run ``postbox migrate``) where PostgreSQL
    answers that one of postbox's tables or functions does not exist."""

    @functools.wraps(func)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            outdated = revision.missing_schema(getattr(exc, "orig", None) or exc)  # SQLAlchemy wraps the driver's
            if outdated is None:
                raise
            raise outdated from exc

    return call


def _unmigrated_async(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The async twin of :func:`_unmigrated`."""

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await func(*args, **kwargs)
        except Exception as exc:
            outdated = revision.missing_schema(getattr(exc, "orig", None) or exc)
            if outdated is None:
                raise
            raise outdated from exc

    return call


@_unmigrated
def enqueue(
    conn: SyncTarget,
    task: TaskRef,
    args: Mapping[str, Any] | None = None,
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    max_queue_depth: int = 0,
    **options: Unpack[EnqueueOptions],
) -> JobId:
    """Insert one job in ``conn``'s current transaction; return its outbox id (a :class:`JobId`).

    ``conn`` is a psycopg 3 connection, or a SQLAlchemy ``Session`` /
    ``Connection``, or Django's connection: the job joins the transaction open
    there (:mod:`postbox.connections`).

    Options: the keys of :class:`EnqueueOptions` — queue, priority, delay
    (seconds or timedelta), run_at (aware datetime), max_attempts, dedup_key,
    headers, expires_at, keep_result; the type checker checks their names and
    types. ``registry`` and ``limits`` replace the default registry and the
    payload limit of the settings. With ``max_queue_depth`` > 0 a queue holding
    that many waiting jobs (pending, queued, retrying) refuses the job with
    :class:`~postbox.errors.QueueFullError` (the API's ``POSTBOX_MAX_QUEUE_DEPTH``):
    the count and the insert run under a per-queue lock held until the
    transaction ends, so concurrent enqueues cannot overshoot it (psycopg
    connections only). With a dedup key that a live job of the same queue holds, nothing is
    inserted and that job's id is returned, with ``duplicate`` True; so with a
    unique task's key that a job holds (docs/unique-jobs.md). A unique task's
    enqueue holds its key's advisory lock until the transaction ends.

    In pipeline mode (``with conn.pipeline():``) a job without a dedup key (nor
    a uniqueness rule) is sent with an id drawn ahead (:mod:`postbox.ids`) and the
    call returns without waiting: the INSERT travels with the next statement or
    the COMMIT, so it costs the transaction no round trip. A server-side error
    then surfaces at that next sync, and the transaction is rolled back as usual.

    On a connection of another driver the job is written by the SQL function
    ``postbox.enqueue()``, which applies the rule published in ``postbox.tasks``
    and returns only an id: ``duplicate`` is then always False.
    """
    row = prepare(task, args, registry=registry, limits=limits, **options)
    params = row.params()
    if not isinstance(conn, Connection):
        target = connections.resolve(conn)
        if not isinstance(target, Connection):
            return JobId(target(params))
        conn = target
    if row.dedup_key is None and row.unique_rule is None and not max_queue_depth and conn.pgconn.pipeline_status:
        params["id"] = take_id(conn)
        conn.execute(sql.active().JOB_INSERT_WITH_ID, params)
        return JobId(params["id"])
    return _insert(conn, row, max_queue_depth)


def insert_steps(row: JobRow, max_queue_depth: int = 0) -> Generator[Step, tuple[Any, ...] | None, JobId]:
    """The statements that insert one validated job, for a driver to send (sync or async alike).

    Each step yields (statement, parameters) — every statement returns rows — and
    receives the reply's first row (None: no row); the generator returns the job's :class:`JobId`. The one
    enqueue path: :func:`enqueue`, :func:`enqueue_async` (and through them
    ``ctx.enqueue()``, the typed handles, the REST API and the admin CLI) and
    :func:`enqueue_many` for unique tasks all insert through it.

    A dedup key that a live job holds returns that job (``duplicate``); a unique
    task's key is locked (until the transaction ends) and its holder returned
    (docs/unique-jobs.md); with ``max_queue_depth`` the queue's depth is checked
    under its lock after those, so a duplicate is never refused for a full queue.
    """
    statements = sql.active()
    while True:
        if row.dedup_key is not None and (row.unique_rule is not None or max_queue_depth > 0):
            found = yield statements.JOB_GET_BY_DEDUP_KEY, row.params()
            if found is not None:
                return JobId(found[0], duplicate=True)
        if row.unique_rule is not None:
            claim = yield statements.JOB_LOCK_UNIQUE_KEY, _claim_params(row)
            assert claim is not None  # a function call returns its one row
            key, holder = claim
            if holder is not None:
                return JobId(holder, duplicate=True)
            row = row._replace(unique_key=key)
        if max_queue_depth > 0:
            yield statements.QUEUE_LOCK_DEPTH, {"lock_class": DEPTH_LOCK_CLASS, "queue": row.queue}
            counted = yield statements.JOB_COUNT_WAITING, {"queue": row.queue, "limit": max_queue_depth}
            depth = int(counted[0]) if counted else 0
            if depth >= max_queue_depth:
                raise QueueFullError(
                    f"queue {row.queue!r} holds {depth} waiting jobs (limit {max_queue_depth})",
                    retry_after=QUEUE_FULL_RETRY_AFTER,
                    details={"queue": row.queue, "limit": max_queue_depth},
                )
        params = row.params()
        found = yield statements.JOB_INSERT, params
        if found is not None:
            return JobId(found[0])
        if row.dedup_key is not None:
            found = yield statements.JOB_GET_BY_DEDUP_KEY, params
            if found is not None:
                return JobId(found[0], duplicate=True)
        # The key's holder was deleted between our two statements: insert again.


def _insert(conn: Connection[Any], row: JobRow, max_queue_depth: int = 0) -> JobId:
    """Run :func:`insert_steps` on a psycopg connection."""
    steps = insert_steps(row, max_queue_depth)
    reply: tuple[Any, ...] | None = None
    with conn.cursor() as cur:
        try:
            while True:
                statement, params = steps.send(reply)
                cur.execute(statement, params)
                reply = cur.fetchone()  # every step returns rows (in pipeline mode too: fetch syncs)
        except StopIteration as done:
            return cast(JobId, done.value)


async def _insert_async(conn: AsyncConnection[Any], row: JobRow, max_queue_depth: int = 0) -> JobId:
    """Run :func:`insert_steps` on a psycopg async connection."""
    steps = insert_steps(row, max_queue_depth)
    reply: tuple[Any, ...] | None = None
    async with conn.cursor() as cur:
        try:
            while True:
                statement, params = steps.send(reply)
                await cur.execute(statement, params)
                reply = await cur.fetchone()
        except StopIteration as done:
            return cast(JobId, done.value)


def _claim_params(row: JobRow) -> dict[str, Any]:
    return {"task": row.task, "args": row.args, "unique_rule": row.unique_rule}


@_unmigrated_async
async def enqueue_async(
    conn: AsyncTarget,
    task: TaskRef,
    args: Mapping[str, Any] | None = None,
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    max_queue_depth: int = 0,
    **options: Unpack[EnqueueOptions],
) -> JobId:
    """The async twin of :func:`enqueue`: a psycopg ``AsyncConnection``, or SQLAlchemy's ``AsyncSession`` or
    ``AsyncConnection``."""
    row = prepare(task, args, registry=registry, limits=limits, **options)
    params = row.params()
    if not isinstance(conn, AsyncConnection):
        target = await connections.resolve_async(conn)
        if not isinstance(target, AsyncConnection):
            return JobId(await target(params))
        conn = target
    if row.dedup_key is None and row.unique_rule is None and not max_queue_depth and conn.pgconn.pipeline_status:
        params["id"] = await take_id_async(conn)
        await conn.execute(sql.active().JOB_INSERT_WITH_ID, params)
        return JobId(params["id"])
    return await _insert_async(conn, row, max_queue_depth)


def prepare_many(
    items: Iterable[Mapping[str, Any]],
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    **common: Unpack[EnqueueOptions],
) -> list[JobRow]:
    """Validate every item first (each a dict with ``task``, ``args`` and options).

    The fast path checks options once per distinct (task, options) and
    validates each task's args as one list, in one call into pydantic-core.
    Any bad item sends the batch through the one-by-one path, which raises the
    error of the first bad item in input order, its index in the message.
    """
    reg = registry or default_registry
    limit = (limits or _limits_from_settings()).max_payload_bytes
    batch = items if isinstance(items, list) else list(items)
    try:
        return _prepare_batch(batch, reg, limit, dict(common))
    except (EnqueueError, TypeError, ValidationError, PydanticSerializationError):
        return _prepare_each(batch, reg, limit, dict(common))


def _prepare_batch(
    items: list[Mapping[str, Any]], registry: Registry, limit: int, common: dict[str, Any]
) -> list[JobRow]:
    templates: dict[Any, tuple[TaskSpec, JobRow]] = {}
    groups: dict[str, tuple[TaskSpec, list[int], list[dict[str, Any]]]] = {}
    plan: list[JobRow] = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or "task" not in item:
            raise InvalidOptionError("not a job item")
        task = item["task"]
        options = {k: v for k, v in item.items() if k != "task" and k != "args"}
        # type(v) in the key: True == 1 and hashes alike, but is not a valid priority
        key = (task, tuple((k, type(v), v) for k, v in options.items())) if options else task
        cached = templates.get(key)  # TypeError (unhashable option, e.g. headers): one by one
        if cached is None:
            spec = registry.resolve(task)
            cached = templates[key] = (spec, _template(spec, **common, **options))
        spec, template = cached
        args = item.get("args")
        if args is None:
            args = {}
        elif type(args) is not dict:
            if not isinstance(args, Mapping):
                raise InvalidArgsError("not a mapping")
            args = dict(args)
        _check_exact(spec, args)
        group = groups.get(spec.name)
        if group is None:
            group = groups[spec.name] = (spec, [], [])
        group[1].append(index)
        group[2].append(args)
        plan.append(template)
    for spec, indexes, arg_list in groups.values():
        serializer = spec.args_model.__pydantic_serializer__
        for index, model in zip(indexes, spec.validate_args_list(arg_list), strict=True):
            payload = serializer.to_json(model, exclude_unset=True)
            if SUSPECT_NUMBER.search(payload):
                _check_numbers(model.model_dump())
            if len(payload) > limit:
                raise PayloadTooLargeError("over the limit")
            plan[index] = _with_args(plan[index], _sealed(spec, payload))
    return plan


def _prepare_each(
    items: list[Mapping[str, Any]], registry: Registry, limit: int, common: dict[str, Any]
) -> list[JobRow]:
    rows = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or "task" not in item:
            raise InvalidOptionError(f"item {index}: each item is a mapping with a 'task' key", field=f"items.{index}")
        options = {k: v for k, v in item.items() if k != "task" and k != "args"}
        try:
            spec = registry.resolve(item["task"])
            payload = _args_payload(spec, item.get("args"), limit)
            rows.append(_with_args(_template(spec, **common, **options), payload))
        except EnqueueError as exc:
            exc.args = (f"item {index}: {exc.args[0]}",)
            exc.details.setdefault("index", index)
            raise
        except TypeError as exc:
            raise InvalidOptionError(f"item {index}: {exc}", field=f"items.{index}") from None
    return rows


def _with_args(template: JobRow, args: str) -> JobRow:
    return JobRow(template[0], template[1], args, *template[3:])


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


def _copy_rows(
    rows: Sequence[JobRow], ids: list[tuple[int, datetime]], fair: Mapping[str, str]
) -> Iterable[tuple[Any, ...]]:
    """COPY rows for jobs without dedup keys; ``ids`` are (id, database now()) pairs.

    ``fair``: the fair queues' key arguments (:func:`postbox.fairness.declared`): a
    job of one of them is written with its key, so the relay need not key it.
    """
    now = ids[0][1]
    for (job_id, _), row in zip(sorted(ids), rows, strict=True):
        available = row.run_at if row.run_at is not None else now + timedelta(seconds=row.delay)
        by = fair.get(row.queue) if fair else None
        yield (
            job_id, row.queue, row.task, row.args, row.priority, available, row.max_attempts,
            row.headers, row.expires_at, row.timeout, row.keep_result,
            None if by is None else fairness.key_of(row.args, by),
        )  # fmt: skip


@_unmigrated
def enqueue_many(
    conn: SyncTarget,
    items: Iterable[Mapping[str, Any]],
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    **common: Unpack[EnqueueOptions],
) -> list[int]:
    """Insert many jobs in one statement in ``conn``'s transaction; ids in input order.

    Without dedup keys the statement is a COPY; with any, an INSERT ... ON CONFLICT.
    On a connection of another driver (:mod:`postbox.connections`), one call of
    the SQL function per job. With any job of a unique task (docs/unique-jobs.md),
    the jobs are inserted one by one, in input order, as :func:`enqueue` inserts
    them: each a :class:`JobId`, a duplicate (of an earlier job of the batch too)
    flagged.
    """
    rows = prepare_many(items, registry=registry, limits=limits, **common)
    if not rows:
        return []
    if not isinstance(conn, Connection):
        target = connections.resolve(conn)
        if not isinstance(target, Connection):
            return [target(row.params()) for row in rows]
        conn = target
    if any(row.unique_rule is not None for row in rows):
        return [_insert(conn, row) for row in rows]
    if all(row.dedup_key is None for row in rows):
        fair = fairness.declared(conn)
        with conn.cursor() as cur:
            ids = cur.execute(sql.active().JOB_NEXT_IDS, {"n": len(rows)}).fetchall()
            with cur.copy(sql.active().JOB_COPY_MANY) as copy:
                for values in _copy_rows(rows, ids, fair):
                    copy.write_row(values)
        return sorted(job_id for job_id, _ in ids)
    with conn.cursor() as cur:
        inserted = cur.execute(sql.active().JOB_INSERT_MANY, _bulk_params(rows)).fetchall()
        missing = _missing_keys(rows, inserted)
        existing: dict[tuple[str, str], int] = {}
        if missing["queue"]:
            for job_id, queue, key in cur.execute(sql.active().JOB_GET_MANY_BY_DEDUP_KEY, missing).fetchall():
                existing[(queue, key)] = job_id
    return _assign_ids(rows, inserted, existing)


@_unmigrated_async
async def enqueue_many_async(
    conn: AsyncTarget,
    items: Iterable[Mapping[str, Any]],
    *,
    registry: Registry | None = None,
    limits: Limits | None = None,
    **common: Unpack[EnqueueOptions],
) -> list[int]:
    """The async twin of :func:`enqueue_many`."""
    rows = prepare_many(items, registry=registry, limits=limits, **common)
    if not rows:
        return []
    if not isinstance(conn, AsyncConnection):
        target = await connections.resolve_async(conn)
        if not isinstance(target, AsyncConnection):
            return [await target(row.params()) for row in rows]
        conn = target
    if any(row.unique_rule is not None for row in rows):
        return [await _insert_async(conn, row) for row in rows]
    if all(row.dedup_key is None for row in rows):
        fair = await fairness.declared_async(conn)
        async with conn.cursor() as cur:
            await cur.execute(sql.active().JOB_NEXT_IDS, {"n": len(rows)})
            ids = await cur.fetchall()
            async with cur.copy(sql.active().JOB_COPY_MANY) as copy:
                for values in _copy_rows(rows, ids, fair):
                    await copy.write_row(values)
        return sorted(job_id for job_id, _ in ids)
    async with conn.cursor() as cur:
        await cur.execute(sql.active().JOB_INSERT_MANY, _bulk_params(rows))
        inserted = await cur.fetchall()
        missing = _missing_keys(rows, inserted)
        existing: dict[tuple[str, str], int] = {}
        if missing["queue"]:
            await cur.execute(sql.active().JOB_GET_MANY_BY_DEDUP_KEY, missing)
            for job_id, queue, key in await cur.fetchall():
                existing[(queue, key)] = job_id
    return _assign_ids(rows, inserted, existing)


def _check_numbers(value: Any, path: str = "args") -> None:
    """Refuse an integer outside the signed 64-bit range, NaN and infinities, anywhere in ``value``.

    The same rule as the API's and the worker's JSON: such a number would be
    stored altered (NaN as null) or refused when the job runs.
    """
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ArgsOutOfRangeError(
                f"{path}: integer {value} is outside the signed 64-bit range",
                field=path,
                details={"min": INT64_MIN, "max": INT64_MAX},
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ArgsOutOfRangeError(f"{path}: {value} is not a finite number", field=path)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_numbers(item, f"{path}.{key}")
    elif isinstance(value, list | tuple | set | frozenset):
        for index, item in enumerate(value):
            _check_numbers(item, f"{path}.{index}")


PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _check_exact(spec: TaskSpec, args: Mapping[str, Any]) -> None:
    """Refuse what JSON would carry altered: a naive datetime, a ``Decimal`` outside a ``Decimal`` argument.

    A naive datetime would be stored without a zone, so the handler could not
    tell which moment it meant; a ``Decimal`` given for an ``int``, ``float`` or
    untyped argument would arrive as an ``int``/``float``/``str``, not the exact
    number. An argument declared ``Decimal`` keeps it exact (stored as a string,
    validated back to a ``Decimal`` for the handler). docs/producer.md.
    """
    exact = _decimal_fields(spec.args_model)
    for key, value in args.items():
        if type(value) not in PLAIN_TYPES:
            _check_value(value, f"args.{key}", key in exact)


def _check_value(value: Any, path: str, decimal_ok: bool) -> None:
    if isinstance(value, Decimal):
        if not decimal_ok:
            raise InvalidArgsError(
                f"{path}: Decimal({str(value)!r}) would not arrive as the same number: declare the argument "
                "Decimal, or pass an int, a float or a str",
                field=path,
            )
    elif isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgsError(
                f"{path}: naive datetime {value.isoformat()} has no time zone: pass an aware one "
                "(e.g. datetime.now(UTC), or .replace(tzinfo=...))",
                field=path,
            )
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if type(item) not in PLAIN_TYPES:
                _check_value(item, f"{path}.{key}", decimal_ok)
    elif isinstance(value, list | tuple | set | frozenset):
        for index, item in enumerate(value):
            if type(item) not in PLAIN_TYPES:
                _check_value(item, f"{path}.{index}", decimal_ok)


@lru_cache(maxsize=1024)
def _decimal_fields(model: type[BaseModel]) -> frozenset[str]:
    """The arguments whose declared type holds ``Decimal`` (``Decimal``, ``Decimal | None``, ``list[Decimal]``...)."""
    return frozenset(name for name, info in model.model_fields.items() if _mentions_decimal(info.annotation))


def _mentions_decimal(annotation: Any) -> bool:
    if annotation is Decimal:
        return True
    return any(_mentions_decimal(arg) for arg in get_args(annotation))


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
