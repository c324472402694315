"""Record outcomes in batches, then acknowledge: PostgreSQL first, Redis second.

Finished runs queue up here; a flush every few milliseconds (or every
``max_batch`` items) writes all their outcomes in one fenced statement, and
only then XACKs and XDELs their entries and publishes their events in one
Redis pipeline. An outcome the fence refuses (a newer attempt owns the job) is
never acknowledged: the entry belongs to whoever owns the attempt now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from redis.exceptions import RedisError

from postbox import events, pgarray, redis_conn, resp, sql
from postbox.outcomes import Outcome, outcome_params, storable
from postbox.streams import GROUP, events_channel
from postbox.worker.delivery import Delivery, Job

log = logging.getLogger(__name__)
_GROUP = GROUP.encode()

EVENT_OF_STATE = {"succeeded": "succeeded", "retrying": "retrying", "dead": "dead", "cancelled": "cancelled"}


@dataclass(slots=True)
class Finished:
    delivery: Delivery
    job: Job | None = None  # None: a delivery that did not run (skipped, or ended at claim)
    outcome: Outcome | None = None
    ended_state: str | None = None  # 'dead' / 'expired' decided by the claim itself
    recorded: bool = False  # filled by the flush: outcome committed (so the entry was acknowledged)


async def record_outcomes(
    conn: AsyncConnection[Any],
    worker_id: str,
    items: Sequence[tuple[Job, Outcome]],
    result_ttl: Callable[[Job], float],
    *,
    notify: bool = True,
    also_notify: Sequence[int] = (),
) -> set[int]:
    """Write outcomes fenced by (worker, attempt, running); returns the ids recorded.

    The statement's parameters are :func:`postbox.outcomes.outcome_params`.

    With ``notify`` the finished ids (and ``also_notify``: jobs whose success
    committed in their own ctx.transaction()) wake result waiters.
    """
    params = outcome_params(worker_id, items, result_ttl, notify=notify, also_notify=also_notify)
    cur = await conn.execute(sql.active().JOB_RECORD_OUTCOMES, params)
    return {row[0] for row in await cur.fetchall()}


class Completer:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        redis: redis_conn.AnyRedis,
        prefix: str,
        worker_id: str,
        result_ttl: Callable[[Job], float],
        on_done: Callable[[list[Finished]], None],
        flush_interval: float = 0.002,
        max_batch: int = 500,
        parallel: int = 2,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._redis = redis
        self._channel = events_channel(prefix)
        self._worker_id = worker_id
        self._result_ttl = result_ttl
        self._on_done = on_done
        self._flush_interval = flush_interval
        # An outcome that comes after a quiet spell (no flush began for two intervals) is
        # written at once: at low rates every flush carries one outcome anyway, and waiting
        # put its statement next to the following job's claim (docs/benchmarks.md,
        # twelfth round). Outcomes that follow each other closer than that are batched.
        self._quiet_after = 2 * flush_interval
        self._monotonic = monotonic
        self._flush_began = -1e9
        self._max_batch = max_batch
        self._parallel = parallel  # batches written at once (their acks still leave in order)
        self._items: list[Finished] = []
        self._events: list[bytes] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        # Lifecycle events cost Redis and CPU per job; they are built only while the
        # events channel has subscribers. The check is made at flush time and kept
        # for a second; until a check says "nobody listens", events are built.
        self.events_wanted = True
        self.events_check_interval = 1.0
        self._events_checked = -1e9

    def add(self, item: Finished) -> None:
        if not self._items:  # the first since the run loop took them: wake it (it clears the flag before taking)
            self._idle.clear()
            self._wake.set()
        self._items.append(item)

    def publish(self, evt: dict[str, Any]) -> None:
        """Queue a lifecycle event for the next pipeline (best effort)."""
        if not self.events_maybe_wanted():
            return
        self._events.append(events.encode(evt))
        self._idle.clear()
        self._wake.set()

    def events_maybe_wanted(self) -> bool:
        """False only while a fresh check found no subscriber to the events channel."""
        return self.events_wanted or time.monotonic() - self._events_checked >= self.events_check_interval

    async def _refresh_events_wanted(self) -> None:
        now = time.monotonic()
        if now - self._events_checked < self.events_check_interval:
            return
        self._events_checked = now
        try:
            self.events_wanted = await redis_conn.subscribers(self._redis, self._channel) > 0
        except RedisError:
            self.events_wanted = True  # unknown: keep publishing, best effort as always

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def run(self) -> None:
        flushing: set[asyncio.Task[None]] = set()
        previous: asyncio.Future[None] | None = None

        def flushed(task: asyncio.Task[None]) -> None:
            flushing.discard(task)
            self._wake.set()

        while True:
            if not (self._items or self._events or flushing):
                self._idle.set()
            await self._wake.wait()
            if (
                len(self._items) < self._max_batch
                and not self._closing
                and self._monotonic() - self._flush_began < self._quiet_after
            ):
                await asyncio.sleep(self._flush_interval)
            self._wake.clear()
            self._flush_began = self._monotonic()
            while self._items or self._events:
                items, self._items = self._items[: self._max_batch], self._items[self._max_batch :]
                batch_events, self._events = self._events, []
                acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                task = asyncio.create_task(self._flush(items, batch_events, previous, acked))
                previous = acked
                flushing.add(task)
                task.add_done_callback(flushed)
                if len(flushing) >= self._parallel:
                    await asyncio.wait(flushing, return_when=asyncio.FIRST_COMPLETED)

    async def close(self, wait: float = 10.0) -> None:
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(self._idle.wait(), wait)
        except TimeoutError:
            log.warning("outcomes not flushed before shutdown; their entries will be redelivered")

    async def _flush(
        self,
        items: list[Finished],
        batch_events: list[bytes],
        previous: asyncio.Future[None] | None,
        acked: asyncio.Future[None],
    ) -> None:
        """Write one batch's outcomes; then, in batch order, acknowledge and publish."""
        try:
            writes: list[tuple[Job, Outcome]] = []
            late_results: list[tuple[Job, str]] = []
            # Jobs that succeeded in their own ctx.transaction() and keep their result: announced
            # once it is set. The others were announced by their commit (record_success(), 0016).
            committed: list[int] = []
            for f in items:
                if f.job is None or f.outcome is None:
                    continue
                if _needs_write(f.outcome):
                    writes.append((f.job, f.outcome))
                elif f.outcome.committed and (f.job.keep_result or f.outcome.result is not None):
                    committed.append(f.job.id)
                    if f.outcome.result is not None:
                        late_results.append((f.job, f.outcome.result))
            recorded: set[int] = set()
            if writes or committed:
                recorded = await self._write(writes, late_results, committed)
            await self._refresh_events_wanted()
            if not self.events_wanted:
                batch_events.clear()
            acks: dict[str, list[bytes]] = defaultdict(list)
            for f in items:
                if f.outcome is None:
                    f.recorded = f.ended_state is not None
                    if f.delivery.entry_id:  # (none for a job taken straight from its parking)
                        acks[f.delivery.stream].append(f.delivery.entry_id)
                elif f.outcome.committed or (f.job is not None and f.job.id in recorded):
                    f.recorded = True
                    if f.delivery.entry_id:
                        acks[f.delivery.stream].append(f.delivery.entry_id)
                self._event_for(f, batch_events)
            if previous is not None and not previous.done():
                await asyncio.shield(previous)  # events and acks leave in batch order
            await self._acknowledge(acks, batch_events)
            self._on_done(items)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not stop every later batch
            log.exception("finishing an outcome batch failed; its entries will be redelivered")
        finally:
            if not acked.done():
                acked.set_result(None)

    async def _write(
        self, writes: list[tuple[Job, Outcome]], late: list[tuple[Job, str]], committed: list[int]
    ) -> set[int]:
        """Record ``writes``; set results known only after their ctx.transaction(); wake waiters.

        A failure of the connection is retried (the whole batch, with backoff); any
        other failure is the data's: the batch is written again row by row, so one
        row PostgreSQL refuses never holds up the others (:meth:`_write_isolated`).
        """
        delay = 0.05
        while True:
            try:
                return await self._write_once(writes, late, committed)
            except Exception as exc:
                if not is_transient(exc):
                    log.warning("an outcome batch was refused; recording its rows one by one", exc_info=True)
                    return await self._write_isolated(writes, late, committed)
                if self._closing:
                    log.exception("cannot record outcomes while stopping; their entries will be redelivered")
                    return set()
                log.exception("recording outcomes failed; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _write_once(
        self, writes: list[tuple[Job, Outcome]], late: list[tuple[Job, str]], committed: list[int]
    ) -> set[int]:
        async with self._pool.connection() as conn:
            for job, result in late:
                await conn.execute(
                    sql.active().JOB_SET_RESULT,
                    {"id": job.id, "result": result, "ttl": self._result_ttl(job)},
                )
            if writes:
                return await record_outcomes(conn, self._worker_id, writes, self._result_ttl, also_notify=committed)
            if committed:
                await conn.execute(sql.active().RESULTS_NOTIFY, {"ids": pgarray.ints(committed)})
            return set()

    async def _write_isolated(
        self, writes: list[tuple[Job, Outcome]], late: list[tuple[Job, str]], committed: list[int]
    ) -> set[int]:
        """Write each row alone; a row refused again is recorded in its safe form.

        The safe form keeps the outcome (state, attempt, delay) and replaces what
        PostgreSQL could not take: the result is dropped and the error says why.
        A row refused even so is logged and left unacknowledged (redelivered).
        """
        recorded: set[int] = set()
        for job, result in late:
            try:
                await self._write_once([], [(job, result)], [])
            except Exception:
                log.exception("a kept result was refused; the job stays succeeded without it", extra=_fields(job))
        for item in writes:
            job = item[0]
            for attempt, candidate in enumerate((item, (job, storable(item[1])))):
                try:
                    recorded |= await self._write_with_retries([candidate])
                    break
                except Exception:
                    if attempt == 1:
                        log.exception("an outcome was refused even in its safe form", extra=_fields(job))
                    else:
                        log.warning("an outcome was refused; recording its safe form", extra=_fields(job))
        if committed:
            try:
                await self._write_once([], [], committed)
            except Exception:
                log.exception("waking result waiters failed")
        return recorded

    async def _write_with_retries(self, writes: list[tuple[Job, Outcome]]) -> set[int]:
        delay = 0.05
        while True:
            try:
                return await self._write_once(writes, [], [])
            except Exception as exc:
                if not is_transient(exc) or self._closing:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _event_for(self, f: Finished, out: list[bytes]) -> None:
        if not self.events_wanted:
            return
        kind: str | None = None
        if f.ended_state is not None:
            kind = f.ended_state
        elif f.outcome is not None and f.recorded:
            kind = EVENT_OF_STATE.get(f.outcome.state)
        if kind is None:
            return
        d = f.delivery
        out.append(
            events.encode(
                events.event(
                    kind,  # type: ignore[arg-type]
                    job_id=d.job_id,
                    queue=d.queue,
                    task=d.task,
                    attempt=f.job.attempt if f.job else 0,
                    worker_id=self._worker_id,
                )
            )
        )

    async def _acknowledge(self, acks: dict[str, list[bytes]], pending_events: list[bytes]) -> None:
        if not acks and not pending_events:
            return
        # One buffer, one write, one deadline (jobs/resp.py): redis-py's pipeline packed
        # each command and read each reply under its own timeout, per batch.
        commands: list[bytes] = []
        routes: list[str] = []
        for stream, ids in acks.items():
            key = stream.encode()
            commands.append(resp.command(b"XACK", key, _GROUP, *ids))
            commands.append(resp.command(b"XDEL", key, *ids))
            routes += [stream, stream]
        channel = self._channel.encode()
        commands.extend(resp.publish(channel, payload) for payload in pending_events)
        routes += [self._channel] * len(pending_events)
        try:
            await redis_conn.send(self._redis, list(zip(routes, commands, strict=True)))  # per node on a cluster
        except Exception:
            # The outcomes are committed; unacknowledged entries are reclaimed
            # later and skipped as finished. Nothing is lost.
            log.warning("acknowledging entries failed; they will be reclaimed and skipped", exc_info=True)


def is_transient(exc: BaseException) -> bool:
    """A failure of the connection or the server (worth retrying as is), not of the data."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | PoolTimeout | OSError)


def _fields(job: Job) -> dict[str, Any]:
    d = job.delivery
    return {"outbox_id": d.job_id, "task": d.task, "queue": d.queue, "attempt": job.attempt}


def _needs_write(outcome: Outcome) -> bool:
    return not outcome.committed and outcome.state != "lost"
