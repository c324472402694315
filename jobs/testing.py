"""Helpers for an application's own test suite: what did my code enqueue, and what do those jobs do?

Plain functions on the test's own connection, plus a pytest plugin
(``pytest_plugins = ["postbox.testing"]``) with a ``postbox_conn`` fixture:

- :func:`enqueued` / :func:`enqueued_async` list the jobs the connection's open
  transaction wrote, filtered by task, queue, args (a subset), priority or state;
- :func:`assert_enqueued` / :func:`assert_not_enqueued` (and async twins) fail
  with the list of what *was* enqueued;
- :func:`run_enqueued` (async) and :func:`run_enqueued_sync` run those jobs
  inline, in this process, on this connection: no relay, no Redis, no worker.
  Each run is claimed and recorded with the worker's own SQL, its outcome
  decided by the worker's own code (:mod:`postbox.outcomes`), and the handler
  gets a real ``ctx``: ``ctx.transaction()`` (a savepoint in the test's
  transaction, with the ``processed_jobs`` guarantee), ``ctx.transaction(orm)``
  and ``ctx.atomic()`` (the ORM forms, on the test's session or Django's
  connection), ``ctx.enqueue()`` follow-ups (run in a later round),
  ``RetryLater``, ``Snooze``, ``PermanentError`` and retries (run again at
  once, until they succeed or run out of attempts). They return every run's outcome.

Every helper takes what ``enqueue()`` takes (:mod:`postbox.connections`): a
psycopg 3 connection, a SQLAlchemy ``Session`` / ``Connection`` (the async
ones for the ``_async`` functions and :func:`run_enqueued`), or Django's
connection. The listing works on any driver; running needs psycopg 3
underneath (the handler's ``ctx.transaction()`` is a psycopg connection).

Scope: the jobs of the connection's open transaction only — rows it inserted
(or a savepoint of it did: Django's ``TestCase`` blocks, ``atomic()``), never
jobs another transaction committed, so a shared development database with
thousands of old jobs changes nothing (``postbox.sql`` ``JOB_OF_TRANSACTION_FROM``
says how). A test that commits (Django's ``TransactionTestCase``, an
autocommit connection) has no transaction of its own to look in: the
helpers see nothing there.

Isolation: everything happens in the transaction the test holds on its
connection; roll it back at the end (the ``postbox_conn`` fixture does) and the
jobs, their effects and the ``processed_jobs`` rows are gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, LiteralString

import orjson
from psycopg import AsyncConnection, Connection

from postbox import connections, encryption, outcomes, pgarray, sql
from postbox.connections import AsyncTarget, SyncTarget
from postbox.errors import AlreadyProcessed, JobCancelled, Snooze, UnsupportedConnectionError
from postbox.fence import JobFence
from postbox.outcomes import Outcome
from postbox.progress import Progress, progress
from postbox.registry import Registry, TaskSpec, default_registry

INLINE_WORKER = "worker-inline0"
LEASE_SECONDS = 3600.0
RESULT_TTL = 86_400.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnqueuedJob:
    id: int
    task: str
    queue: str
    priority: int
    args: dict[str, Any]
    headers: dict[str, Any]
    state: str
    attempts: int
    dedup_key: str | None


@dataclass(frozen=True)
class JobRun:
    """One inline run of a job: its attempt and what it came to."""

    job_id: int
    task: str
    attempt: int
    state: str  # succeeded, retrying, dead, cancelled
    result: Any = None
    error_class: str | None = None
    error: str | None = None
    traceback: str | None = None  # a failed run's, bounded (as the attempt history keeps it)


# --- the test's connection ------------------------------------------------------------


def _json(value: Any) -> Any:
    """A jsonb value as a client delivered it: parsed already, or text (Django's loader, asyncpg)."""
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def _refuse_async(conn: object, helper: str, twin: str) -> None:
    if isinstance(conn, AsyncConnection) or type(conn).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise UnsupportedConnectionError(f"{helper}() needs a sync connection: use {twin}() on {type(conn).__name__}")


def _rows(conn: object, statement: LiteralString, helper: str) -> list[tuple[Any, ...]]:
    """The rows of a statement without parameters, on whatever ``enqueue()`` accepts (sync)."""
    _refuse_async(conn, helper, helper + "_async")
    target = connections.resolve(conn)
    if isinstance(target, Connection):
        return target.execute(statement).fetchall()
    sa_conn = connections._sqlalchemy_connection(conn)  # another driver under SQLAlchemy
    if sa_conn is not None:
        from sqlalchemy import text

        return [tuple(r) for r in sa_conn.execute(text(statement)).fetchall()]
    with connections._django_wrapper(conn).cursor() as cur:  # Django on psycopg2
        cur.execute(statement)
        return [tuple(r) for r in cur.fetchall()]


async def _rows_async(conn: object, statement: LiteralString, helper: str) -> list[tuple[Any, ...]]:
    """The async twin of :func:`_rows`."""
    if isinstance(conn, Connection) or connections._sqlalchemy_connection(conn) or connections._django_wrapper(conn):
        name = helper.removesuffix("_async")
        raise UnsupportedConnectionError(f"{helper}() needs an async connection: use {name}() on {type(conn).__name__}")
    target = await connections.resolve_async(conn)
    if isinstance(target, AsyncConnection):
        cur = await target.execute(statement)
        return await cur.fetchall()
    from sqlalchemy import text

    sa_conn = await connections._sqlalchemy_async_connection(conn)
    return [tuple(r) for r in (await sa_conn.execute(text(statement))).fetchall()]


def _psycopg(conn: object, helper: str) -> Connection[Any]:
    """The psycopg 3 connection under ``conn``, which an inline run needs for the handler's ``ctx``."""
    _refuse_async(conn, helper, "run_enqueued")
    target = connections.resolve(conn)
    if not isinstance(target, Connection):
        raise UnsupportedConnectionError(
            f"{helper}() runs jobs on psycopg 3; {type(conn).__name__} is on another driver"
            " (enqueued() and the assertions work there)"
        )
    return target


async def _psycopg_async(conn: object, helper: str) -> AsyncConnection[Any]:
    if isinstance(conn, Connection) or connections._sqlalchemy_connection(conn) or connections._django_wrapper(conn):
        raise UnsupportedConnectionError(
            f"{helper}() needs an async connection: use {helper}_sync() on {type(conn).__name__}"
        )
    target = await connections.resolve_async(conn)
    if not isinstance(target, AsyncConnection):
        raise UnsupportedConnectionError(
            f"{helper}() runs jobs on psycopg 3; {type(conn).__name__} is on another driver"
            " (enqueued_async() and the assertions work there)"
        )
    return target


# --- what was enqueued ----------------------------------------------------------------


def _matches(job: EnqueuedJob, task: Any, queue: str | None, args: Mapping[str, Any] | None, **exact: Any) -> bool:
    if task is not None and job.task != _task_name(task):
        return False
    if queue is not None and job.queue != queue:
        return False
    if args is not None and any(job.args.get(k, _MISSING) != v for k, v in args.items()):
        return False
    return all(value is None or getattr(job, name) == value for name, value in exact.items())


_MISSING = object()


def _task_name(task: Any) -> str:
    return task if isinstance(task, str) else getattr(task, "__postbox_task__", getattr(task, "__name__", str(task)))


def _row(row: tuple[Any, ...]) -> EnqueuedJob:
    job_id, task, queue, priority, args, headers, state, attempts, dedup_key = row
    shown = _opened(task, _json(args), strict=False)  # an encrypted task's, when this process has the key
    return EnqueuedJob(job_id, task, queue, priority, shown, _json(headers), state, attempts, dedup_key)


def _opened(task: str, args: Any, *, strict: bool) -> Any:
    """Sealed args (an encrypted task's) opened with this process's key; ``strict``: no key is an error."""
    if not encryption.is_sealed(args):
        return args
    if not strict and encryption.keyring_or_none() is None:
        return args
    try:
        return orjson.loads(encryption.keyring().open(task, args))
    except encryption.EncryptionError:
        if strict:
            raise
        return args


def _sealed_result(spec: TaskSpec, job_id: int, outcome: Outcome) -> Outcome:
    """An encrypted task's kept result sealed as the worker seals it (bound to its job)."""
    if spec.encrypted and outcome.result is not None:
        outcome.result = encryption.keyring().seal(encryption.result_context(job_id), outcome.result.encode())
    return outcome


def enqueued(
    conn: SyncTarget,
    task: Any = None,
    *,
    queue: str | None = None,
    args: Mapping[str, Any] | None = None,
    priority: int | None = None,
    state: str | None = None,
) -> list[EnqueuedJob]:
    """The jobs ``conn``'s open transaction wrote, oldest first, filtered."""
    jobs = [_row(r) for r in _rows(conn, sql.active().JOB_LIST_OF_TRANSACTION, "enqueued")]
    return [j for j in jobs if _matches(j, task, queue, args, priority=priority, state=state)]


async def enqueued_async(
    conn: AsyncTarget,
    task: Any = None,
    *,
    queue: str | None = None,
    args: Mapping[str, Any] | None = None,
    priority: int | None = None,
    state: str | None = None,
) -> list[EnqueuedJob]:
    """The async twin of :func:`enqueued`."""
    rows = await _rows_async(conn, sql.active().JOB_LIST_OF_TRANSACTION, "enqueued_async")
    jobs = [_row(r) for r in rows]
    return [j for j in jobs if _matches(j, task, queue, args, priority=priority, state=state)]


def _check(found: list[EnqueuedJob], everything: list[EnqueuedJob], what: str, count: int | None) -> None:
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    if (count is None and found) or (count is not None and len(found) == count):
        return
    listing = "\n".join(
        f"  #{j.id} {j.task} queue={j.queue} priority={j.priority} args={j.args} state={j.state}" for j in everything
    )
    wanted = "at least one" if count is None else str(count)
    raise AssertionError(f"expected {wanted} job(s) {what}, found {len(found)}; enqueued:\n{listing or '  (nothing)'}")


def _describe(task: Any, **filters: Any) -> str:
    parts = [f"{_task_name(task)}"] if task is not None else ["of any task"]
    parts += [f"{k}={v!r}" for k, v in filters.items() if v is not None]
    return " ".join(parts)


def _assert(
    everything: list[EnqueuedJob],
    task: Any,
    queue: str | None,
    args: Mapping[str, Any] | None,
    priority: int | None,
    count: int | None,
) -> list[EnqueuedJob]:
    """The one check behind the sync and async assertions."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    found = [j for j in everything if _matches(j, task, queue, args, priority=priority)]
    _check(found, everything, _describe(task, queue=queue, args=args, priority=priority), count)
    return found


def assert_enqueued(
    conn: SyncTarget,
    task: Any = None,
    *,
    queue: str | None = None,
    args: Mapping[str, Any] | None = None,
    priority: int | None = None,
    count: int | None = None,
) -> list[EnqueuedJob]:
    """Fail unless jobs matching the filters were enqueued (``count`` of them, if given); return them."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    return _assert(enqueued(conn), task, queue, args, priority, count)


def assert_not_enqueued(conn: SyncTarget, task: Any = None, **filters: Any) -> None:
    """Fail if a job matching the filters was enqueued."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    assert_enqueued(conn, task, count=0, **filters)


async def assert_enqueued_async(
    conn: AsyncTarget,
    task: Any = None,
    *,
    queue: str | None = None,
    args: Mapping[str, Any] | None = None,
    priority: int | None = None,
    count: int | None = None,
) -> list[EnqueuedJob]:
    """The async twin of :func:`assert_enqueued`."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    return _assert(await enqueued_async(conn), task, queue, args, priority, count)


async def assert_not_enqueued_async(conn: AsyncTarget, task: Any = None, **filters: Any) -> None:
    """The async twin of :func:`assert_not_enqueued`."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    await assert_enqueued_async(conn, task, count=0, **filters)


# --- running them inline --------------------------------------------------------------


class InlineContext:
    """The ``ctx`` of an inline run: the same contract as the worker's (:class:`postbox.JobContext`).

    ``conn`` is the test's async psycopg connection (:func:`run_enqueued`), or
    None (:func:`run_enqueued_sync`: the handler's transaction is then one of
    the ORM forms, on the test's own session or Django connection).
    """

    def __init__(self, conn: AsyncConnection[Any] | None, job_id: int, task: str, queue: str, attempt: int,
                 max_attempts: int, headers: dict[str, Any], registry: Registry) -> None:  # fmt: skip
        self._conn = conn
        self._registry = registry
        self._open: AsyncConnection[Any] | None = None
        self._entered = False
        self.fenced = False  # the success was recorded by the fence (ORM forms), with the body's writes
        self.committed = False
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.headers = headers
        self.worker_id = INLINE_WORKER
        self.deadline: float | None = None
        self.cancelled = False
        self.log = logging.LoggerAdapter(log, {"outbox_id": job_id, "task": task, "attempt": attempt})
        self.reported: list[Progress] = []  # every ctx.progress() value, in order (nothing is written)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Checked as the worker checks it; kept in :attr:`reported` (an inline run writes no progress)."""
        self.reported.append(progress(done, total, note))

    def _enter(self) -> None:
        if self._entered:
            raise RuntimeError("the job's transaction (ctx.transaction() / ctx.atomic()) may be entered once per run")
        self._entered = True

    def job_fence(self) -> JobFence:
        """The run's fence, for the ORM forms (:mod:`postbox.sqlalchemy`, :mod:`postbox.django.job`)."""
        self._enter()
        self.fenced = True
        return JobFence(self.job_id, self.worker_id, self.attempt)

    @asynccontextmanager
    async def _transaction(self, conn: AsyncConnection[Any]) -> AsyncIterator[AsyncConnection[Any]]:
        self._enter()
        async with conn.transaction():  # a savepoint in the test's transaction
            cur = await conn.execute(sql.active().PROCESSED_INSERT, {"id": self.job_id})
            if await cur.fetchone() is None:
                raise AlreadyProcessed(f"job {self.job_id} already committed its effects")
            self._open = conn
            try:
                yield conn
            finally:
                self._open = None
        self.committed = True

    def transaction(self, orm: Any = None) -> Any:
        if orm is not None:
            from postbox.sqlalchemy import JobTransaction

            return JobTransaction(self, orm)
        if self._conn is None:
            raise RuntimeError(
                "ctx.transaction() on the worker's connection runs under run_enqueued() (async, on an async"
                " connection); under run_enqueued_sync() use ctx.transaction(session) or ctx.atomic()"
            )
        return self._transaction(self._conn)

    def atomic(self, using: str | None = None) -> Any:
        from postbox.django.job import atomic

        return atomic(self, using=using)

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        if self._open is None:
            raise RuntimeError("ctx.enqueue() runs inside `async with ctx.transaction()`")
        from postbox.producer import enqueue_async

        options.setdefault("registry", self._registry)
        return await enqueue_async(self._open, task, args, **options)


def _due(rows: list[tuple[Any, ...]], task: Any, queue: str | None, runs: list[JobRun], retries: bool) -> list[int]:
    due = [job_id for job_id, name, q in rows if (task is None or name == _task_name(task)) and queue in (None, q)]
    if not retries:
        done = {run.job_id for run in runs}
        due = [d for d in due if d not in done]
    return due


def _too_many(runs: list[JobRun], max_runs: int) -> None:
    if len(runs) >= max_runs:
        raise RuntimeError(f"run_enqueued: more than {max_runs} runs; a job that enqueues itself?")


async def run_enqueued(
    conn: AsyncTarget,
    task: Any = None,
    *,
    queue: str | None = None,
    registry: Registry | None = None,
    retries: bool = True,
    max_runs: int = 1000,
) -> list[JobRun]:
    """Run the due jobs ``conn``'s open transaction wrote (filtered by task or queue) inline; return each run.

    Rounds go on while jobs are due: follow-ups enqueued by handlers run in a
    later round, and (with ``retries``) a retried job runs again at once,
    whatever its backoff, until it succeeds or runs out of attempts. Jobs with a
    future run time are left alone, and so is every job another transaction
    committed. ``max_runs`` stops a job that enqueues itself forever
    (``RuntimeError``). Sync handlers run on a thread, as the worker runs them.
    """
    pg = await _psycopg_async(conn, "run_enqueued")
    reg = registry or default_registry
    runs: list[JobRun] = []
    while True:
        cur = await pg.execute(sql.active().JOB_GET_DUE_OF_TRANSACTION)
        due = _due(await cur.fetchall(), task, queue, runs, retries)
        if not due:
            return runs
        for job_id in due:
            _too_many(runs, max_runs)
            run = await _run_one(pg, job_id, reg)
            if run is not None:
                runs.append(run)


def run_enqueued_sync(
    conn: SyncTarget,
    task: Any = None,
    *,
    queue: str | None = None,
    registry: Registry | None = None,
    retries: bool = True,
    max_runs: int = 1000,
) -> list[JobRun]:
    """The sync twin of :func:`run_enqueued`, for sync tests (Django, a SQLAlchemy ``Session``).

    Sync handlers run in the calling thread, so Django's connection (one per
    thread) is the test's. An async handler runs to completion on an event
    loop of its own; its ``ctx.transaction()`` needs :func:`run_enqueued`.
    Refused inside a running event loop: ``await run_enqueued()`` there.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_enqueued_sync() inside a running event loop: use `await run_enqueued()`")
    pg = _psycopg(conn, "run_enqueued_sync")
    reg = registry or default_registry
    runs: list[JobRun] = []
    while True:
        due = _due(pg.execute(sql.active().JOB_GET_DUE_OF_TRANSACTION).fetchall(), task, queue, runs, retries)
        if not due:
            return runs
        for job_id in due:
            _too_many(runs, max_runs)
            run = _run_one_sync(pg, job_id, reg)
            if run is not None:
                runs.append(run)


def _claim_params(job_id: int) -> dict[str, Any]:
    return {"ids": pgarray.ints([job_id]), "entries": None, "worker": INLINE_WORKER, "lease": LEASE_SECONDS}


async def _run_one(conn: AsyncConnection[Any], job_id: int, registry: Registry) -> JobRun | None:
    cur = await conn.execute(sql.active().JOB_CLAIM_ATTEMPTS, _claim_params(job_id))
    claimed = await cur.fetchone()
    if claimed is None or claimed[1] != "running":
        return None
    _, _, attempt, max_attempts, _, keep_result = claimed[:6]
    cur = await conn.execute(sql.active().JOB_GET_PAYLOAD, {"id": job_id})
    name, queue, args, headers = await cur.fetchone()  # type: ignore[misc]
    ctx = InlineContext(conn, job_id, name, queue, attempt, max_attempts, _json(headers) or {}, registry)
    try:
        spec = registry.get(name)
        call_args = spec.call_args(_opened(name, _json(args), strict=True))
        if spec.is_async:
            value = await spec.fn(ctx, **call_args)
        else:
            value = await asyncio.to_thread(spec.fn, ctx, **call_args)
        outcome = _sealed_result(spec, job_id, _outcome(value, None, attempt, max_attempts, keep_result))
    except (Exception, AlreadyProcessed, JobCancelled) as exc:  # the last two are BaseExceptions
        value, outcome = (
            (exc if isinstance(exc, Snooze) else None),
            _outcome(None, exc, attempt, max_attempts, keep_result),
        )
    if isinstance(value, Snooze):  # raised or returned: decided with the job's snoozes so far
        snooze, value = value, None
        cur = await conn.execute(sql.active().JOB_ATTEMPT_COUNT_SNOOZES, {"id": job_id})
        outcome = _snoozed(snooze, (await cur.fetchone() or (0,))[0], registry, name, attempt, max_attempts)
    statement, params = _record(ctx, outcome)
    if statement is not None:
        await conn.execute(statement, params)
    if outcome.state == "retrying":
        await conn.execute(sql.active().JOB_RETRY_DUE_NOW, {"id": job_id})
    return _job_run(job_id, name, attempt, value if keep_result else None, outcome)


def _run_one_sync(conn: Connection[Any], job_id: int, registry: Registry) -> JobRun | None:
    claimed = conn.execute(sql.active().JOB_CLAIM_ATTEMPTS, _claim_params(job_id)).fetchone()
    if claimed is None or claimed[1] != "running":
        return None
    _, _, attempt, max_attempts, _, keep_result = claimed[:6]
    name, queue, args, headers = conn.execute(sql.active().JOB_GET_PAYLOAD, {"id": job_id}).fetchone()  # type: ignore[misc]
    ctx = InlineContext(None, job_id, name, queue, attempt, max_attempts, _json(headers) or {}, registry)
    try:
        spec: TaskSpec = registry.get(name)
        call_args = spec.call_args(_opened(name, _json(args), strict=True))
        if spec.is_async:
            value = asyncio.run(spec.fn(ctx, **call_args))
        else:
            value = spec.fn(ctx, **call_args)  # this thread: Django's connection is the test's
        outcome = _sealed_result(spec, job_id, _outcome(value, None, attempt, max_attempts, keep_result))
    except (Exception, AlreadyProcessed, JobCancelled) as exc:  # the last two are BaseExceptions
        value, outcome = (
            (exc if isinstance(exc, Snooze) else None),
            _outcome(None, exc, attempt, max_attempts, keep_result),
        )
    if isinstance(value, Snooze):  # raised or returned: decided with the job's snoozes so far
        snooze, value = value, None
        count = conn.execute(sql.active().JOB_ATTEMPT_COUNT_SNOOZES, {"id": job_id}).fetchone() or (0,)
        outcome = _snoozed(snooze, count[0], registry, name, attempt, max_attempts)
    statement, params = _record(ctx, outcome)
    if statement is not None:
        conn.execute(statement, params)
    if outcome.state == "retrying":
        conn.execute(sql.active().JOB_RETRY_DUE_NOW, {"id": job_id})
    return _job_run(job_id, name, attempt, value if keep_result else None, outcome)


@dataclass(frozen=True, slots=True)
class _Attempt:
    id: int
    attempt: int


def _outcome(value: Any, exc: BaseException | None, attempt: int, max_attempts: int, keep_result: bool) -> Outcome:
    """What a run that returned ``value`` or raised ``exc`` came to, decided as the worker decides it
    (:mod:`postbox.outcomes`); a retry is due at once, whatever its backoff or ``RetryLater`` delay."""
    if exc is None:
        return outcomes.succeeded(value, keep_result=keep_result)
    outcome = outcomes.raised(exc, attempt=attempt, max_attempts=max_attempts, backoff=outcomes.NO_BACKOFF, rand=_half)
    outcome.delay = 0.0
    return outcome


def _snoozed(snooze: Snooze, snoozes: int, registry: Registry, task: str, attempt: int, max_attempts: int) -> Outcome:
    """A snooze decided as the worker decides it (:func:`postbox.outcomes.snoozed`), due at once."""
    spec = registry.get(task)
    outcome = outcomes.snoozed(
        snooze,
        snoozes=snoozes,
        max_snoozes=spec.max_snoozes,
        attempt=attempt,
        max_attempts=max_attempts,
        backoff=outcomes.NO_BACKOFF,
        rand=_half,
    )
    outcome.delay = 0.0
    return outcome


def _half() -> float:
    return 0.5  # no jitter (and no backoff: NO_BACKOFF)


def _record(ctx: InlineContext, outcome: Outcome) -> tuple[LiteralString | None, dict[str, Any]]:
    """The worker's statement and parameters that record ``outcome`` (None: nothing left to record)."""
    if outcome.kind == "succeeded" and ctx.fenced and ctx.committed:
        # The ORM forms recorded the success with the body's writes (the fence).
        if outcome.result is None:
            return None, {}
        return sql.active().JOB_SET_RESULT, {"result": outcome.result, "ttl": RESULT_TTL, "id": ctx.job_id}
    attempt = _Attempt(ctx.job_id, ctx.attempt)
    return sql.active().JOB_RECORD_OUTCOMES, outcomes.outcome_params(
        INLINE_WORKER, [(attempt, outcome)], _result_ttl, notify=False
    )


def _result_ttl(_: _Attempt) -> float:
    return RESULT_TTL


def _job_run(job_id: int, task: str, attempt: int, value: Any, outcome: Outcome) -> JobRun:
    return JobRun(job_id, task, attempt, outcome.state, value, outcome.error_class, outcome.error, outcome.traceback)


# --- the pytest plugin ----------------------------------------------------------------

try:
    import pytest
    import pytest_asyncio
except ImportError:  # neither is a dependency of postbox: the fixture exists only where both are installed
    pytest_asyncio = None  # type: ignore[assignment]

if pytest_asyncio is not None:

    @pytest_asyncio.fixture
    async def postbox_conn() -> AsyncIterator[AsyncConnection[Any]]:
        """An ``AsyncConnection`` to ``POSTBOX_DATABASE_URL`` (or ``DATABASE_URL``) in a transaction rolled back
        after the test: the jobs it enqueues, their inline runs and their effects leave nothing behind."""
        url = os.environ.get("POSTBOX_DATABASE_URL") or os.environ.get("DATABASE_URL")
        if not url:
            pytest.skip("postbox_conn needs POSTBOX_DATABASE_URL or DATABASE_URL")
        conn = await AsyncConnection.connect(url)
        try:
            yield conn
        finally:
            await conn.rollback()
            await conn.close()
