"""The leader's schedule duty: enqueue each due occurrence of every periodic job, once.

The relay's leading loop calls :meth:`ScheduleDuty.step` on every pass and
folds :meth:`ScheduleDuty.wait_hint` into its sleep. ``step`` costs a clock
comparison until the earliest next run (or ``refresh`` seconds) has come;
then it ticks (:func:`postbox.schedule_store.tick`) on the leader's own lock
session, batch after batch while batches come back full, and asks the
database when the next schedule is due. A schedule that is not due is never
read: the leader's cost does not grow with the number of idle schedules. The
``refresh`` bound is how soon a schedule that a worker's start, a resume or a
new deployment made due earlier is noticed.

After each committed tick it counts the occurrences and their lateness in the
relay's metrics and publishes an ``enqueued`` event per occurrence (with
``schedule`` and ``occurrence``) on the events channel, best effort, while
someone subscribes (``emit_events=None``, as the publisher does) or always
(``True``).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram
from psycopg import AsyncConnection
from psycopg.errors import UndefinedTable
from redis.exceptions import RedisError

from postbox import events, schedule_store
from postbox.redis_conn import AnyRedis, subscribers
from postbox.schedule_store import Fired, TickReport
from postbox.streams import events_channel

log = logging.getLogger(__name__)
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600)
RUN_RETENTION_SECONDS = 7 * 86_400.0
PRUNE_EVERY_SECONDS = 3600.0
MIN_WAIT = 0.02  # seconds
FAILED_TICK_RETRY = 60.0  # seconds before a tick that raised (not a database error) is tried again


class ScheduleMetrics:
    """Counters of the schedule duty, registered beside the relay's own (bounded labels: queue, task)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.enqueued = Counter(
            "postbox_schedule_occurrences",
            "Schedule occurrences enqueued by the leading relay.",
            ["queue", "task"],
            registry=registry,
        )
        self.skipped = Counter(
            "postbox_schedule_skipped",
            "Missed schedule occurrences left out by their catch-up policy.",
            registry=registry,
        )
        self.lateness = Histogram(
            "postbox_schedule_lateness_seconds",
            "Seconds between an occurrence's time and the tick that enqueued it.",
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )


_metrics: weakref.WeakKeyDictionary[CollectorRegistry, ScheduleMetrics] = weakref.WeakKeyDictionary()


def metrics_for(registry: CollectorRegistry | None) -> ScheduleMetrics:
    """The duty's metrics in ``registry``, created once (a relay leads many terms, one registry)."""
    if registry is None:
        return ScheduleMetrics(None)
    found = _metrics.get(registry)
    if found is None:
        found = _metrics[registry] = ScheduleMetrics(registry)
    return found


class ScheduleDuty:
    """See the module docstring. ``clock`` (tests) replaces the database's now."""

    def __init__(
        self,
        *,
        redis: AnyRedis | None = None,
        prefix: str = "postbox",
        registry: CollectorRegistry | None = None,
        refresh: float = 5.0,
        batch_size: int = 1000,
        tick_timeout: float | None = None,
        emit_events: bool | None = None,
        clock: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_tick: Callable[[TickReport], None] | None = None,
    ) -> None:
        self.redis = redis
        self.channel = events_channel(prefix).encode()
        self.metrics = metrics_for(registry)
        self.refresh = refresh
        self.batch_size = batch_size
        self.tick_timeout_ms = None if tick_timeout is None else int(tick_timeout * 1000)
        self.emit_events = emit_events
        self.clock = clock
        self.monotonic = monotonic
        self.on_tick = on_tick
        self.next_look = monotonic()  # the first step looks at once
        self.next_prune = monotonic()
        self.enqueued_total = 0
        self.disabled = False

    def wait_hint(self) -> float | None:
        """Seconds until the duty wants to run again (None: never, e.g. no schedules table)."""
        if self.disabled:
            return None
        return max(0.0, self.next_look - self.monotonic())

    async def step(self, conn: AsyncConnection[Any]) -> int:
        """Tick if something may be due; returns the occurrences enqueued.

        A database error propagates (the relay's session loop decides about its
        session and its leadership). Any other error is a bug in evaluating a
        schedule: logged, and the duty looks again after FAILED_TICK_RETRY
        seconds, so publishing goes on and no leader after this one dies of it.
        """
        if self.disabled or self.monotonic() < self.next_look:
            return 0
        try:
            return await self._step(conn)
        except psycopg.Error:
            raise
        except Exception:
            log.exception("periodic jobs: a tick failed; looking again in %.0f s", FAILED_TICK_RETRY)
            self.next_look = self.monotonic() + FAILED_TICK_RETRY
            return 0

    async def _step(self, conn: AsyncConnection[Any]) -> int:
        enqueued = 0
        while True:
            now = self.clock() if self.clock is not None else None
            try:
                report = await schedule_store.tick(
                    conn, now=now, limit=self.batch_size, timeout_ms=self.tick_timeout_ms
                )
            except UndefinedTable:
                log.warning("no schedules table: run `postbox migrate`; periodic jobs are off in this relay")
                self.disabled = True
                return enqueued
            enqueued += len(report.fired)
            self._count(report)
            if report.fired:
                await self._publish(report.fired)
            if self.on_tick is not None:
                self.on_tick(report)
            if not report.full:
                break
        earliest, db_now = await schedule_store.next_due(conn)
        now = self.clock() if self.clock is not None else db_now
        wait = self.refresh
        if earliest is not None:
            # floor: a due schedule that another transaction holds (SKIP LOCKED) is not spun on
            wait = min(wait, max(MIN_WAIT, (earliest - now).total_seconds()))
        self.next_look = self.monotonic() + wait
        if self.monotonic() >= self.next_prune:
            self.next_prune = self.monotonic() + PRUNE_EVERY_SECONDS
            await schedule_store.prune_runs(conn, older_than=RUN_RETENTION_SECONDS)
        return enqueued

    def _count(self, report: TickReport) -> None:
        self.enqueued_total += len(report.fired)
        for fired in report.fired:
            self.metrics.enqueued.labels(fired.queue, fired.task).inc()
            self.metrics.lateness.observe(fired.lateness)
        if report.skipped:
            self.metrics.skipped.inc(report.skipped)

    async def _publish(self, fired: list[Fired]) -> None:
        if self.redis is None or self.emit_events is False:
            return
        try:
            if self.emit_events is None and not await self._listened():
                return
            pipe = self.redis.pipeline(transaction=False)
            for item in fired:
                evt = events.event("enqueued", job_id=item.job_id, queue=item.queue, task=item.task)
                evt["schedule"] = item.schedule
                evt["occurrence"] = item.occurrence.isoformat()
                pipe.publish(self.channel, events.encode(evt))
            await pipe.execute()
        except RedisError as exc:  # events are best effort: the jobs are committed
            log.warning("schedule events not published", extra={"error": str(exc)})

    async def _listened(self) -> bool:
        """Whether anyone subscribes to the events channel (``emit_events=None``: publish only then)."""
        assert self.redis is not None
        return await subscribers(self.redis, self.channel) > 0
