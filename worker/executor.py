"""Run one claimed attempt: resolve the handler, build ``ctx``, call it, decide the outcome.

Async handlers are awaited on the event loop; sync ones run on handler threads
(:mod:`postbox.worker.threads`). A per-job timeout (the job's, else the task's) turns
into a retryable :class:`~postbox.outcomes.JobTimeout`, for sync handlers too:
the worker stops waiting for a stuck thread and abandons it. Only registered handlers ever run: an
unknown task or invalid args end the job in the dead letters without a call.
What each end means for the job is decided by :mod:`postbox.outcomes`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import orjson
from psycopg_pool import AsyncConnectionPool

from postbox import encryption, hooks, outcomes, sql, tracing
from postbox.encryption import EncryptionError
from postbox.errors import AlreadyProcessed, InvalidArgsError, JobCancelled, Snooze
from postbox.outcomes import JobTimeout, Outcome
from postbox.progress import Progress
from postbox.registry import Registry, TaskSpec
from postbox.settings import Settings
from postbox.worker.context import StaleAttempt, WorkerJobContext
from postbox.worker.delivery import Delivery, Job
from postbox.worker.threads import HandlerThreads

log = logging.getLogger(__name__)

DEFAULT_RESULT_TTL = 86_400.0


class Executor:
    def __init__(
        self,
        *,
        settings: Settings,
        registry: Registry,
        pool: AsyncConnectionPool[Any],
        worker_id: str,
        threads: HandlerThreads,
        transactions: asyncio.Semaphore | None = None,
        on_start: Callable[[Job], None] | None = None,
        on_progress: Callable[[Job, Progress], None] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._pool = pool
        self._transactions = transactions
        self._worker_id = worker_id
        self._threads = threads
        self._on_start = on_start
        self._on_progress = on_progress
        self._rand = rand
        self._handlers: dict[str, tuple[TaskSpec, bool, bool]] = {}
        self._recording = tracing.RecordingCheck()

    def spec(self, task: str) -> TaskSpec | None:
        return self._registry.get(task) if task in self._registry else None

    def _handler(self, task: str) -> tuple[TaskSpec, bool, bool] | None:
        """(spec, is async, takes no args), looked up once per task name."""
        found = self._handlers.get(task)
        if found is None:
            spec = self.spec(task)
            if spec is None:
                return None
            found = self._handlers[task] = (spec, spec.is_async, not spec.args_model.model_fields)
        return found

    def result_ttl(self, job: Job) -> float:
        spec = self.spec(job.delivery.task)
        return spec.result_ttl if spec is not None else DEFAULT_RESULT_TTL

    def arguments(self, delivery: Delivery) -> dict[str, Any] | Exception:
        """The handler's keyword arguments from the delivery's args, or why its handler refuses them.

        Call only for a task this worker knows.
        """
        handler = self._handler(delivery.task)
        assert handler is not None
        spec, _, no_args = handler
        try:
            raw = orjson.loads(delivery.args)
            if not isinstance(raw, dict):
                raise InvalidArgsError("args must be a JSON object")
            if spec.encrypted:  # opened here, in the worker only (postbox.encryption)
                raw = _opened(spec, raw)
            return {} if no_args and not raw else spec.call_args(raw)
        except (InvalidArgsError, orjson.JSONDecodeError, EncryptionError) as exc:
            return exc

    async def run(self, job: Job) -> Outcome:
        """Run the attempt; never raises except CancelledError from a shutdown.

        With hooks registered (:mod:`postbox.hooks`) they are called around the
        run; with OpenTelemetry installed and a tracer provider set the run is a span
        (:mod:`postbox.tracing`).
        """
        if not hooks.registered and not self._recording():
            return await self._run(job, None)
        delivery = job.delivery
        info = hooks.JobRun(job.id, delivery.task, delivery.queue, job.attempt, job.max_attempts, self._worker_id)
        failures: list[BaseException] = []
        started = time.monotonic()
        with tracing.process_span(job.id, delivery.task, delivery.queue, job.attempt, delivery.headers):
            await hooks.call(hooks.registered.before, info)
            outcome = await self._run(job, failures)
            info.state, info.duration = outcome.state, time.monotonic() - started
            for exc in failures:
                await hooks.call(hooks.registered.failure, info, exc)
            await hooks.call(hooks.registered.after, info)
        return outcome

    async def _run(self, job: Job, failures: list[BaseException] | None) -> Outcome:
        delivery = job.delivery
        handler = self._handler(delivery.task)
        if handler is None:
            grace = self._settings.unknown_task_grace
            return outcomes.dead(
                "UnknownTaskError",
                f"no handler is registered for task {delivery.task!r} on this worker, and no worker took the job"
                f" within the grace period (POSTBOX_UNKNOWN_TASK_GRACE={grace:g} s)",
            )
        spec, is_async, _ = handler
        kwargs = delivery.kwargs
        if kwargs is None:
            found = self.arguments(delivery)
            if isinstance(found, Exception):
                grace = self._settings.unknown_task_grace
                note = f" (handed back for POSTBOX_UNKNOWN_TASK_GRACE={grace:g} s first)" if grace else ""
                return outcomes.dead(outcomes.error_class(found), f"{found}{note}")
            kwargs = found
        if spec.unique is not None and spec.unique.debounce is not None:
            fresh = await self._debounced_args(job, spec)
            if isinstance(fresh, Outcome):
                return fresh
            kwargs = fresh if fresh is not None else kwargs
        timeout = job.timeout or spec.timeout
        ctx = WorkerJobContext(
            job,
            worker_id=self._worker_id,
            pool=self._pool,
            transactions=self._transactions,
            registry=self._registry,
            deadline=time.monotonic() + timeout if timeout else None,
            on_progress=self._on_progress,
        )
        if self._on_start is not None:
            self._on_start(job)
        outcome = await self._call(ctx, job, spec, is_async, kwargs, timeout, failures)
        # The last progress reported is written before the outcome (which the completer writes next).
        await ctx.flush_progress()
        return outcome

    async def _debounced_args(self, job: Job, spec: TaskSpec) -> dict[str, Any] | Outcome | None:
        """A debounced job's arguments as committed when it was claimed (None: the run is no longer current)."""
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    sql.active().JOB_GET_ARGS_OF_ATTEMPT,
                    {"id": job.id, "attempt": job.attempt, "worker": self._worker_id},
                )
                row = await cur.fetchone()
        except Exception as exc:  # as a failure of the run: retried, counted
            return self._failed(job, spec, exc)
        if row is None:
            return None
        try:
            return spec.call_args(orjson.loads(row[0]))
        except (InvalidArgsError, orjson.JSONDecodeError) as exc:
            return outcomes.dead(outcomes.error_class(exc), str(exc))

    async def _call(
        self,
        ctx: WorkerJobContext,
        job: Job,
        spec: TaskSpec,
        is_async: bool,
        kwargs: dict[str, Any],
        limit: float | None,
        failures: list[BaseException] | None,
    ) -> Outcome:
        """Call the handler and decide what its end means."""
        try:
            if is_async and not limit:
                value = await spec.fn(ctx, **kwargs)
            else:
                async with asyncio.timeout(limit):
                    if is_async:
                        value = await spec.fn(ctx, **kwargs)
                    else:
                        value = await self._threads.run(hooks.on_thread(spec.fn), ctx, **kwargs)
        except AlreadyProcessed:
            ctx.log.info("effects already committed by an earlier run; recorded as a duplicate")
            return outcomes.duplicate()
        except StaleAttempt:
            ctx.log.warning("attempt superseded by a newer one; its transaction rolled back")
            return Outcome("lost", "lost")
        except JobCancelled:
            return self._after_commit(ctx, job, outcomes.cancelled())
        except asyncio.CancelledError:
            if not is_async:
                _abandoned(ctx, "stopped")
            if job.cancel_requested:
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                return self._after_commit(ctx, job, outcomes.cancelled())
            raise
        except TimeoutError as exc:
            if not is_async:
                _abandoned(ctx, "timed out")
            if ctx.committed:
                return _committed(None, keep_result=False)
            timed_out = JobTimeout(f"handler ran past its {limit}s timeout") if limit else exc
            return self._failed_run(ctx, job, spec, timed_out, failures)
        except Exception as exc:
            if ctx.committed:
                ctx.log.warning("handler raised after its transaction committed; the job stays succeeded")
                return _committed(None, keep_result=False)
            if isinstance(exc, Snooze):
                return await self._snoozed(ctx, job, spec, exc)
            return self._failed_run(ctx, job, spec, exc, failures)
        if isinstance(value, Snooze) and not ctx.committed:  # returned rather than raised: the same
            return await self._snoozed(ctx, job, spec, value)
        if ctx.committed:
            return _sealed_result(spec, job, _committed(value, keep_result=job.keep_result))
        return _sealed_result(spec, job, outcomes.succeeded(value, keep_result=job.keep_result))

    def _after_commit(self, ctx: WorkerJobContext, job: Job, outcome: Outcome) -> Outcome:
        return _committed(None, keep_result=False) if ctx.committed else outcome

    def failed_inside(self, job: Job, exc: BaseException) -> Outcome:
        """The outcome of a run that the worker itself failed to finish (a bug, never the handler's)."""
        spec = self.spec(job.delivery.task)
        if spec is None:
            return outcomes.dead(outcomes.error_class(exc), outcomes.error_text(exc))
        return self._failed(job, spec, exc)

    def _failed_run(
        self,
        ctx: WorkerJobContext,
        job: Job,
        spec: TaskSpec,
        exc: BaseException,
        failures: list[BaseException] | None,
    ) -> Outcome:
        """A run whose handler raised: its outcome, logged with its bounded traceback."""
        outcome = self._failed(job, spec, exc)
        trace = f"\n{outcome.traceback}" if outcome.traceback else ""
        ctx.log.warning("run failed (%s): %s: %s%s", outcome.kind, outcome.error_class, outcome.error, trace)
        if failures is not None:
            failures.append(exc)
        return outcome

    async def _snoozed(self, ctx: WorkerJobContext, job: Job, spec: TaskSpec, exc: Snooze) -> Outcome:
        """A snooze, free while the job's earlier snoozes (read from its history) stay under the task's bound."""
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.active().JOB_ATTEMPT_COUNT_SNOOZES, {"id": job.id})
                row = await cur.fetchone()
            snoozes = int(row[0]) if row is not None else 0
        except Exception:
            # Unknown count: the snooze is counted as an attempt, so the bound holds whatever happens.
            ctx.log.warning("counting the job's snoozes failed; this snooze counts as an attempt", exc_info=True)
            snoozes = spec.max_snoozes
        outcome = outcomes.snoozed(
            exc,
            snoozes=snoozes,
            max_snoozes=spec.max_snoozes,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            backoff=outcomes.backoff(spec.retry, self._settings),
            rand=self._rand,
        )
        ctx.log.info("run %s: %s", outcome.kind, outcome.error)
        return outcome

    def _failed(self, job: Job, spec: TaskSpec, exc: BaseException) -> Outcome:
        backoff = outcomes.backoff(spec.retry, self._settings)
        return outcomes.failed(
            exc, attempt=job.attempt, max_attempts=job.max_attempts, backoff=backoff, rand=self._rand
        )


def _opened(spec: TaskSpec, raw: dict[str, Any]) -> dict[str, Any]:
    """An encrypted task's args, opened with this worker's keys; refused when they were stored in the clear."""
    if not encryption.is_sealed(raw):
        raise InvalidArgsError(
            f"task {spec.name!r} is encrypted but this job's args were stored in the clear"
            " (enqueued by SQL postbox.enqueue(), which cannot encrypt?): refused, not run"
        )
    value = orjson.loads(encryption.keyring().open(spec.name, raw))
    if not isinstance(value, dict):
        raise InvalidArgsError("the opened args are not a JSON object")
    return value


def _sealed_result(spec: TaskSpec, job: Job, outcome: Outcome) -> Outcome:
    """An encrypted task's kept result, sealed under the first key and bound to its job (postbox.encryption)."""
    if spec.encrypted and outcome.result is not None:
        sealed = encryption.keyring().seal(encryption.result_context(job.id), outcome.result.encode())
        outcome.result = sealed
    return outcome


def _abandoned(ctx: WorkerJobContext, why: str) -> None:
    ctx.log.warning("sync handler %s; its thread cannot be stopped and is abandoned (its value is dropped)", why)


def _committed(value: Any, *, keep_result: bool) -> Outcome:
    outcome = outcomes.succeeded(value, keep_result=keep_result)
    outcome.committed = True
    return outcome
