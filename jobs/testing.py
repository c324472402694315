"""Helpers for an application's own test suite: what did my code enqueue, and what do those jobs do?

Plain functions on the test's own connection, so they see the jobs of the
transaction the test has open (nothing needs to commit), plus a pytest plugin
(``pytest_plugins = ["postbox.testing"]``) with a ``postbox_conn`` fixture:

- :func:`enqueued` / :func:`enqueued_async` list the jobs in ``postbox.outbox``,
  filtered by task, queue, args (a subset), priority or state;
- :func:`assert_enqueued` / :func:`assert_not_enqueued` (and async twins) fail
  with the list of what *was* enqueued;
- :func:`run_enqueued` runs the due jobs inline, in this process, on this
  connection: no relay, no Redis, no worker. Each run is claimed and recorded
  with the worker's own SQL, and the handler gets a real ``ctx``:
  ``ctx.transaction()`` (a savepoint in the test's transaction, with the
  ``processed_jobs`` guarantee), ``ctx.enqueue()`` follow-ups (run in a later
  round), ``RetryLater``, ``PermanentError`` and retries (run again at once,
  until they succeed or run out of attempts). It returns every run's outcome.

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
from typing import Any

import orjson
from psycopg import AsyncConnection, Connection

from postbox import pgarray, sql
from postbox.errors import AlreadyProcessed, InvalidArgsError, JobCancelled, PermanentError, RetryLater
from postbox.registry import Registry, UnknownTaskError, default_registry
from postbox.text import traceback_text

INLINE_WORKER = "worker-inline0"
LEASE_SECONDS = 3600.0
RESULT_TTL = 86_400.0
log = logging.getLogger("postbox.testing")


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
    return EnqueuedJob(*row)


def enqueued(
    conn: Connection[Any],
    task: Any = None,
    *,
    queue: str | None = None,
    args: Mapping[str, Any] | None = None,
    priority: int | None = None,
    state: str | None = None,
) -> list[EnqueuedJob]:
    """The jobs visible to ``conn`` (its open transaction included), oldest first, filtered."""
    rows = conn.execute(sql.active().JOB_LIST_ALL).fetchall()
    jobs = [_row(r) for r in rows]
    return [j for j in jobs if _matches(j, task, queue, args, priority=priority, state=state)]


async def enqueued_async(
    conn: AsyncConnection[Any],
    task: Any = None,
    *,
    queue: str | None = None,
    args: Mapping[str, Any] | None = None,
    priority: int | None = None,
    state: str | None = None,
) -> list[EnqueuedJob]:
    """The async twin of :func:`enqueued`."""
    cur = await conn.execute(sql.active().JOB_LIST_ALL)
    jobs = [_row(r) for r in await cur.fetchall()]
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
    conn: Connection[Any],
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


def assert_not_enqueued(conn: Connection[Any], task: Any = None, **filters: Any) -> None:
    """Fail if a job matching the filters was enqueued."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    assert_enqueued(conn, task, count=0, **filters)


async def assert_enqueued_async(
    conn: AsyncConnection[Any],
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


async def assert_not_enqueued_async(conn: AsyncConnection[Any], task: Any = None, **filters: Any) -> None:
    """The async twin of :func:`assert_not_enqueued`."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    await assert_enqueued_async(conn, task, count=0, **filters)


# --- running them inline --------------------------------------------------------------


class InlineContext:
    """The ``ctx`` of an inline run: the same contract as the worker's (:class:`postbox.JobContext`)."""

    def __init__(self, conn: AsyncConnection[Any], job_id: int, task: str, queue: str, attempt: int,
                 max_attempts: int, headers: dict[str, Any], registry: Registry) -> None:  # fmt: skip
        self._conn = conn
        self._registry = registry
        self._open: AsyncConnection[Any] | None = None
        self._entered = False
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

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        if self._entered:
            raise RuntimeError("ctx.transaction() may be entered once per run")
        self._entered = True
        async with self._conn.transaction():  # a savepoint in the test's transaction
            cur = await self._conn.execute(sql.active().PROCESSED_INSERT, {"id": self.job_id})
            if await cur.fetchone() is None:
                raise AlreadyProcessed(f"job {self.job_id} already committed its effects")
            self._open = self._conn
            try:
                yield self._conn
            finally:
                self._open = None
        self.committed = True

    def transaction(self) -> Any:
        return self._transaction()

    async def enqueue(
        self, task: str | Callable[..., Any], args: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        if self._open is None:
            raise RuntimeError("ctx.enqueue() runs inside `async with ctx.transaction()`")
        from postbox.producer import enqueue_async

        options.setdefault("registry", self._registry)
        return await enqueue_async(self._open, task, args, **options)


async def run_enqueued(
    conn: AsyncConnection[Any],
    task: Any = None,
    *,
    queue: str | None = None,
    registry: Registry | None = None,
    retries: bool = True,
    max_runs: int = 1000,
) -> list[JobRun]:
    """Run every due job visible to ``conn`` (filtered by task or queue) inline; return each run's outcome.

    Rounds go on while jobs are due: follow-ups enqueued by handlers run in a
    later round, and (with ``retries``) a retried job runs again at once,
    whatever its backoff, until it succeeds or runs out of attempts. Jobs with a
    future run time are left alone. ``max_runs`` stops a job that enqueues
    itself forever (``RuntimeError``).
    """
    reg = registry or default_registry
    runs: list[JobRun] = []
    while True:
        cur = await conn.execute(sql.active().JOB_GET_DUE)
        due = [(job_id, name, q) for job_id, name, q in await cur.fetchall()]
        due = [d for d in due if (task is None or d[1] == _task_name(task)) and (queue is None or d[2] == queue)]
        if not retries:
            done = {run.job_id for run in runs}
            due = [d for d in due if d[0] not in done]
        if not due:
            return runs
        for job_id, _, _ in due:
            if len(runs) >= max_runs:
                raise RuntimeError(f"run_enqueued: more than {max_runs} runs; a job that enqueues itself?")
            run = await _run_one(conn, job_id, reg)
            if run is not None:
                runs.append(run)


async def _run_one(conn: AsyncConnection[Any], job_id: int, registry: Registry) -> JobRun | None:
    cur = await conn.execute(
        sql.active().JOB_CLAIM_ATTEMPTS,
        {"ids": pgarray.ints([job_id]), "worker": INLINE_WORKER, "lease": LEASE_SECONDS},
    )
    claimed = await cur.fetchone()
    if claimed is None or claimed[1] != "running":
        return None
    _, _, attempt, max_attempts, _, keep_result = claimed[:6]
    cur = await conn.execute(sql.active().JOB_GET_PAYLOAD, {"id": job_id})
    name, queue, args, headers = await cur.fetchone()  # type: ignore[misc]
    ctx = InlineContext(conn, job_id, name, queue, attempt, max_attempts, headers or {}, registry)
    state, kind, result, cls, message, trace = "succeeded", "succeeded", None, None, None, None
    try:
        spec = registry.get(name)
        call_args = spec.call_args(args)
        if spec.is_async:
            value = await spec.fn(ctx, **call_args)
        else:
            value = await asyncio.to_thread(spec.fn, ctx, **call_args)
        result = value if keep_result else None
    except AlreadyProcessed:
        kind = "duplicate"
    except JobCancelled:
        state, kind = "cancelled", "cancelled"
    except Exception as exc:
        cls, message = type(exc).__name__, str(exc) or type(exc).__name__
        trace = None if isinstance(exc, RetryLater) else traceback_text(exc)
        permanent = isinstance(exc, PermanentError | InvalidArgsError | UnknownTaskError)
        if permanent or attempt >= max_attempts:
            state, kind = "dead", "dead"
        else:
            state, kind = "retrying", "retry"
    encoded = None
    if state == "succeeded" and result is not None:
        encoded = orjson.dumps(result).decode()
    elif state == "dead":
        encoded = orjson.dumps({"error": {"class": cls, "message": message}}).decode()
    params = {
        "worker": INLINE_WORKER,
        "ids": pgarray.ints([job_id]),
        "attempts": pgarray.ints([attempt]),
        "states": pgarray.words([state]),
        "delays": pgarray.floats([0.0]),
        "results": pgarray.texts_or_null([encoded]),
        "result_ttls": pgarray.floats([RESULT_TTL]),
        "error_classes": pgarray.texts_or_null([cls]),
        "errors": pgarray.texts_or_null([message]),
        "tracebacks": pgarray.texts_or_null([trace]),
        "outcomes": pgarray.words([kind]),
        "notify": False,
        "also_notify": None,
    }
    await conn.execute(sql.active().JOB_RECORD_OUTCOMES, params)
    return JobRun(job_id, name, attempt, state, result, cls, message, trace)


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
