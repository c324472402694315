"""The relay service: stand by, lead, publish, recover — until stopped.

Run it in a process (``postbox relay run``) or in-process::

    relay = Relay(settings)
    task = asyncio.create_task(relay.run())
    ...
    relay.stop()          # finish the batch in hand, release the lock, return
    await task

Tests and benchmarks pass :class:`RelaySignals` to await what the relay did
("batch published", "became leader", ...) instead of sleeping. In production
every signal is ``None`` and costs nothing.

One leader at a time: every relay opens a lock session (:mod:`postbox.relay.leader`)
and retries the advisory lock every ``lock_retry_interval`` while it stands by.
The leader publishes on that same session; any error of that session means the
lock may be gone, so the relay logs ``lost leadership``, drops the session and
stands by again on a new one.

A standby says what it waits on (:attr:`Relay.waiting_on`, logged as
``standby`` when it enters standby, when that changes, and every
``standby_report_interval``): the lock's holder (the relay registered as leader,
or the PostgreSQL backend holding the lock), and Redis when it does not answer
— a standby that took the lock could not publish either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection
from redis.exceptions import RedisError

from postbox import redis_conn, revision, sql
from postbox.cancellation import cancel_all
from postbox.relay.fairness import FairQueues, FillResult
from postbox.relay.leader import LeaderSession, LeadershipLost
from postbox.relay.metrics import RelayMetrics
from postbox.relay.notifier import Notifier, notified_rows
from postbox.relay.publisher import BatchResult, Publisher
from postbox.relay.reconciler import Reconciler
from postbox.relay.scheduler import ScheduleDuty
from postbox.relay.workflow_events import WorkflowEvents
from postbox.retention import PruneDuty
from postbox.settings import Settings
from postbox.startup import hide_password

log = logging.getLogger(__name__)


@dataclass
class RelaySignals:
    """Optional test hooks, fired when the relay has done something. ``None`` = off."""

    published: asyncio.Queue[list[int]] | None = None  # ids of every published batch
    republished: asyncio.Queue[list[int]] | None = None  # ids republished after Redis loss / lost entries
    leader: asyncio.Event | None = None  # became leader
    standby: asyncio.Event | None = None  # (re)entered standby
    lost_leadership: asyncio.Event | None = None
    listening: asyncio.Event | None = None  # LISTEN (re)established
    workflow_events_listening: asyncio.Event | None = None  # the workflow events' LISTEN (re)established
    redis_loss: asyncio.Event | None = None  # a Redis data loss was detected
    idle: asyncio.Event | None = None  # the leader's loop went to wait, nothing in hand and no wake-up pending
    stopped: asyncio.Event | None = None
    before_mark: Callable[[list[int]], Awaitable[None]] | None = None  # awaited between XADD and mark
    before_look: Callable[[], Awaitable[None]] | None = None  # awaited as a look beside the publishing begins

    @classmethod
    def all(cls) -> RelaySignals:
        """Every signal on (tests)."""
        return cls(
            published=asyncio.Queue(),
            republished=asyncio.Queue(),
            leader=asyncio.Event(),
            standby=asyncio.Event(),
            lost_leadership=asyncio.Event(),
            listening=asyncio.Event(),
            workflow_events_listening=asyncio.Event(),
            redis_loss=asyncio.Event(),
            idle=asyncio.Event(),
            stopped=asyncio.Event(),
        )


def _fire(event: asyncio.Event | None) -> None:
    if event is not None:
        event.set()


class Relay:
    """One relay process's worth of work. See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        *,
        signals: RelaySignals | None = None,
        relay_id: str | None = None,
        metrics: RelayMetrics | None = None,
        lock_retry_interval: float = 0.5,
        heartbeat_interval: float = 1.0,
        epoch_check_interval: float = 1.0,
        sweep_interval: float = 5.0,
        sweep_min_age: float = 5.0,
        emit_events: bool | None = None,
        standby_report_interval: float = 60.0,
    ) -> None:
        self.settings = settings
        self.database_url = settings.require_database_url()
        self.redis_url = settings.require_redis_url()
        self.signals = signals or RelaySignals()
        self.id = relay_id or f"relay-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or RelayMetrics()
        self.track_backlog = metrics is not None or settings.relay_metrics_port > 0
        self.lock_retry_interval = lock_retry_interval
        self.heartbeat_interval = heartbeat_interval
        self.epoch_check_interval = epoch_check_interval
        self.sweep_interval = sweep_interval
        self.sweep_min_age = sweep_min_age
        self.emit_events = emit_events
        self.standby_report_interval = standby_report_interval
        self.waiting_on = ""  # what a standby waits on (see the module docstring); empty when leading
        self.role = "starting"
        self.term = 0
        self.published_total = 0
        self.republished_total = 0
        self.session: LeaderSession | None = None
        self.notifier: Notifier | None = None
        self.workflow_events: WorkflowEvents | None = None
        self.reconciler: Reconciler | None = None
        self._stop = asyncio.Event()
        self._wake: asyncio.Event | None = None
        self._next_standby_log = 0.0
        self._standby_holder: tuple[Any, ...] = ()

    # --- control -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the relay to finish the batch in hand, release the lock and return from :meth:`run`."""
        self._stop.set()
        if self._wake is not None:
            self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, seconds))

    # --- main loop -----------------------------------------------------------------

    async def run(self) -> None:
        """Stand by / lead until :meth:`stop`; always releases the lock before returning."""
        redis = redis_conn.connect(self.settings, decode_responses=False, socket_timeout=5, socket_connect_timeout=2)
        if self.settings.relay_metrics_port:
            self.metrics.serve(self.settings.relay_metrics_port)
        try:
            while not self.stopping:
                await self._session_loop(redis)
        finally:
            self.role = "stopped"
            self.metrics.is_leader.set(0)
            with contextlib.suppress(Exception):
                await redis.aclose()
            self.metrics.close()
            log.info("stopped", extra={"relay_id": self.id, "role": "stopped"})
            _fire(self.signals.stopped)

    async def _session_loop(self, redis: redis_conn.AnyRedis) -> None:
        session: LeaderSession | None = None
        try:
            session = await self._open_session()
            if session is None:
                return  # stopped while connecting
            self.session = session
            await session.register("standby")
            self._set_role("standby")
            next_beat = time.monotonic() + self.heartbeat_interval
            next_report = 0.0
            while not self.stopping:
                if await session.try_acquire():
                    self.waiting_on = ""
                    await self._lead(session, redis)
                    return
                if time.monotonic() >= next_report:
                    await self._report_standby(session, redis)
                    next_report = time.monotonic() + min(self.standby_report_interval, 5.0)
                if time.monotonic() >= next_beat:
                    await session.heartbeat()
                    next_beat = time.monotonic() + self.heartbeat_interval
                await self._sleep(self.lock_retry_interval)
        except (psycopg.Error, LeadershipLost) as exc:
            outdated = revision.missing_schema(exc, self.settings.schema_name)
            if outdated is not None:  # not an outage: waiting would log this forever
                raise outdated from None
            if self.role == "leader":
                log.warning(
                    "lost leadership",
                    extra={"relay_id": self.id, "role": "standby", "term": self.term, "error": str(exc).strip()},
                )
                self.metrics.is_leader.set(0)
                _fire(self.signals.lost_leadership)
            else:
                log.warning("database unavailable", extra={"relay_id": self.id, "error": str(exc).strip()})
            self.role = "lost"
            await self._sleep(self.lock_retry_interval)
        finally:
            self.session = None
            if session is not None:
                if self.stopping and not session.conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        await session.release()
                with contextlib.suppress(psycopg.Error):
                    await session.close()

    async def _report_standby(self, session: LeaderSession, redis: redis_conn.AnyRedis) -> None:
        """Find out what this standby waits on; log it when it changed, or every ``standby_report_interval``."""
        cur = await session.conn.execute(
            sql.active().LEADER_GET_HOLDER, {"key": self.settings.relay_lock_key, "id": self.id}
        )
        row = await cur.fetchone()
        waits = [standby_lock_text(row, self.settings.relay_lock_key)]
        try:
            async with asyncio.timeout(3):
                await redis.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            waits.append(f"Redis at {hide_password(self.redis_url)} does not answer ({reason})")
        waiting_on = "; ".join(waits)
        now = time.monotonic()
        self.waiting_on = waiting_on
        holder = (row[0], row[3], len(waits)) if row is not None else (None, None, len(waits))
        if holder != self._standby_holder or now >= self._next_standby_log:
            self._standby_holder = holder
            self._next_standby_log = now + self.standby_report_interval
            (log.warning if len(waits) > 1 else log.info)(
                f"standby: waiting for {waiting_on}",
                extra={"relay_id": self.id, "role": "standby", "waiting_on": waiting_on},
            )

    async def _open_session(self) -> LeaderSession | None:
        """Connect the lock session; None if :meth:`stop` was called first (a stop never waits for a connect)."""
        opening = asyncio.ensure_future(
            LeaderSession.open(
                self.database_url,
                relay_id=self.id,
                lock_key=self.settings.relay_lock_key,
                session_timeout=self.settings.relay_session_timeout,
                worker_lease=self.settings.visibility_timeout,
            )
        )
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({opening, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if opening.done():
            return opening.result()
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
            session = await opening
            await session.close()
        return None

    def _set_role(self, role: str) -> None:
        if role == self.role:
            return
        self.role = role
        extra: dict[str, Any] = {"relay_id": self.id, "role": role}
        if role == "leader":
            extra["term"] = self.term
            self.metrics.is_leader.set(1)
            log.info("leader", extra=extra)
            _fire(self.signals.leader)
        else:
            self.metrics.is_leader.set(0)
            if role != "standby":  # a standby says what it waits on instead (_report_standby)
                log.info(role, extra=extra)
            if role == "standby":
                _fire(self.signals.standby)

    # --- leading -------------------------------------------------------------------

    async def _lead(self, session: LeaderSession, redis: redis_conn.AnyRedis) -> None:
        self.term = session.term
        self._set_role("leader")
        conn = session.conn
        batch_size = self.settings.relay_batch_size
        wake = asyncio.Event()
        self._wake = wake
        if self.stopping:
            wake.set()
        notifier = self.notifier = Notifier(self.database_url, wake, on_listening=lambda: _fire(self.signals.listening))
        listener = asyncio.create_task(notifier.run(), name=f"{self.id}-listener")
        # Workflow events (relay/workflow_events.py): releases, cascade cancels and ended
        # workflows, forwarded from PostgreSQL's NOTIFYs on a connection of their own.
        self.workflow_events = WorkflowEvents(
            self.database_url,
            redis,
            self.settings.redis_prefix,
            self.settings.schema_name,
            emit_events=self.emit_events,
            on_listening=lambda: _fire(self.signals.workflow_events_listening),
            metrics=self.metrics,
        )
        forwarder = asyncio.create_task(self.workflow_events.run(), name=f"{self.id}-workflow-events")
        publisher = Publisher(
            redis,
            self.settings.redis_prefix,
            batch_size=batch_size,
            emit_events=self.emit_events,
            before_mark=self.signals.before_mark,
            mark_delay=self.settings.relay_mark_delay,
        )
        publisher.term = session.term  # every mark checks that no newer leader was recorded
        # Fair queues (relay/fairness.py): their rows wait for their queue's window.
        fair = FairQueues(
            publisher,
            default_window=self.settings.fair_window,
            poll_interval=self.settings.fair_poll_interval,
            on_fill=self._record_fill,
        )
        await fair.refresh(conn, force=True)
        reconciler = Reconciler(
            redis,
            self.settings.redis_prefix,
            publisher,
            rate=self.settings.republish_rate,
            batch_size=batch_size,
            sweep_interval=self.sweep_interval,
            sweep_min_age=self.sweep_min_age,
            on_republished=self._on_republished,
            on_loss=lambda: _fire(self.signals.redis_loss),
            on_finding=wake.set,  # a look beside this loop found a loss (or failed): act on it now
            before_look=self.signals.before_look,
        )
        self.reconciler = reconciler
        # Retention: the leader runs bounded pruning rounds on a connection of its own
        # (POSTBOX_PRUNE_INTERVAL; 0 = off, e.g. when `postbox prune` runs from cron).
        prune = PruneDuty(self.settings, self.database_url)
        # Periodic jobs: due occurrences enqueued on this lock session (relay/scheduler.py).
        schedules = ScheduleDuty(
            redis=redis,
            prefix=self.settings.redis_prefix,
            registry=self.metrics.registry,
            tick_timeout=self.settings.relay_session_timeout,
            emit_events=self.emit_events,
        )
        next_beat = 0.0
        next_check = 0.0
        selected_at = 0.0  # when the last select went out (monotonic)
        backlog = False  # its last batch was full
        redis_down = False
        try:
            while not self.stopping:
                notified = wake.is_set()  # an insert's NOTIFY (or a stop) woke this round
                wake.clear()
                payloads, bare = notifier.take()  # jobs that came with their notifications (relay/notifier.py)
                await schedules.step(conn)  # needs no Redis: occurrences go to the outbox
                try:
                    # Redis-loss check first (so a loss is never mistaken for our own fresh
                    # entries), then publish, then the other chores.
                    # On one server the look at the streams runs beside this loop (Reconciler.check):
                    # a look that finished is judged here, at the turn after it.
                    now = time.monotonic()
                    check_due = now >= next_check
                    if check_due or publisher.writes_lost or reconciler.landed() or reconciler.must_check():
                        await reconciler.check(conn, due=check_due)
                        if check_due:
                            next_check = now + reconciler.check_every(self.epoch_check_interval)
                    carried_all, batch = False, None
                    if payloads and session.looks_alive():  # sent before any select, which skips them as held
                        carried = notified_rows(payloads, self.settings.schema_name)
                        batch, sent = await publisher.publish_notified(conn, carried, on_batch=self._record, hold=True)
                        carried_all = sent and len(carried) == len(payloads) and not bare and notified
                    if carried_all and not backlog and now - selected_at < self.settings.poll_interval:
                        # Every wake-up since the last turn brought its job and each went out: the
                        # select would find nothing those did not, as one at most a poll interval ago
                        # found the rest (docs/relay.md, "Jobs that come with their notification").
                        results = [batch or BatchResult()]
                    else:
                        selected_at = now
                        results = await publisher.publish_burst(
                            conn,
                            # one batch at a time while a fair queue's jobs wait: its window is
                            # refilled between batches, not after a burst keying a backlog
                            max_batches=1 if fair.busy() else 8,
                            keep_going=lambda: not self.stopping,
                            on_batch=self._record,
                            hold=True,  # a part batch's mark may wait, to go with the next ones
                        )
                        backlog = results[-1].selected >= batch_size
                    await publisher.flush_marks(conn, due_only=True)
                    await fair.step(conn, notified=notified)
                    await reconciler.step(conn)
                    await reconciler.sweep(conn)
                except RedisError as exc:
                    if not redis_down:
                        log.warning("Redis unavailable", extra={"relay_id": self.id, "error": str(exc)})
                    redis_down = True
                    next_check = 0.0  # check the epoch as soon as Redis answers again, before publishing
                    reconciler.redis_failed()
                    await session.heartbeat()  # keep the lock session from going idle
                    await self._wait(wake, min(0.5, self.heartbeat_interval))
                    continue
                if redis_down:
                    log.info("Redis available again", extra={"relay_id": self.id})
                    redis_down = False
                now = time.monotonic()
                if now >= next_beat:
                    await session.heartbeat()
                    if self.track_backlog:
                        await self._update_backlog(conn)
                    next_beat = now + self.heartbeat_interval
                prune.kick()
                last = results[-1]
                if last.failed and not last.published:
                    reconciler.redis_failed()  # refused outright (READONLY, OOM...): look before the next try
                    await self._wait(wake, 0.5)
                    continue
                if last.selected >= batch_size or reconciler.busy():
                    await asyncio.sleep(0)  # more is due: next batch at once
                    continue
                timeout = min(
                    self.settings.poll_interval,
                    self.heartbeat_interval,
                    reconciler.check_every(self.epoch_check_interval),
                )
                marks_in = publisher.marks_due_in()
                # While marks are held, the next delayed row is asked with them (their mark's row
                # answers it): a delayed row due meanwhile waits at most the mark delay.
                due = await publisher.next_due(conn) if marks_in is None else marks_in
                if due is not None:
                    timeout = min(timeout, max(0.001, due))
                for hint in (reconciler.wait_hint(), schedules.wait_hint(), fair.wait_hint()):
                    if hint is not None:
                        timeout = min(timeout, max(0.001, hint))
                if not wake.is_set():
                    _fire(self.signals.idle)
                await self._wait(wake, timeout)
            await publisher.flush_marks(conn)  # stopping: what was sent is marked, not sent again
        finally:
            self._wake = None
            reconciler.close()  # a look at the streams under way beside the loop
            await prune.stop()
            # (a connect under way can lose one cancel)
            await cancel_all([listener, forwarder, *reconciler.dropped_looks()])
            self.notifier = None
            self.workflow_events = None

    async def _wait(self, wake: asyncio.Event, seconds: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the wait in a task of its
        # own, and a wake-up reached this loop three turns of the event loop after the set().
        if wake.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()

    def _record(self, result: BatchResult) -> None:
        if not result.selected:
            return
        self.metrics.batch_size.observe(result.selected)
        if result.published:
            self.published_total += len(result.published)
            self.metrics.published.inc(len(result.published))
            if self.signals.published is not None:
                self.signals.published.put_nowait(result.published)

    def _record_fill(self, fill: FillResult) -> None:
        self.metrics.fair_in_flight.labels(fill.queue).set(fill.in_flight + len(fill.batch.published))
        self._record(fill.batch)

    def _on_republished(self, ids: list[int]) -> None:
        self.republished_total += len(ids)
        self.metrics.republished.inc(len(ids))
        if self.signals.republished is not None:
            self.signals.republished.put_nowait(ids)

    async def _update_backlog(self, conn: AsyncConnection[Any]) -> None:
        cur = await conn.execute(sql.active().JOB_COUNT_BACKLOG)
        row = await cur.fetchone()
        if row is not None:
            self.metrics.backlog.set(row[0])
            self.metrics.oldest_age.set(row[1])


def standby_lock_text(row: Any, key: int) -> str:
    """What a standby waits on, from :data:`~postbox.sql.Statements.LEADER_GET_HOLDER`'s row.

    ``None``: the lock is free right now.
    """
    if row is None:
        return f"the leader lock (key {key}), free: taking it next"
    backend, application, client, relay, host, pid, term, silent = row
    if relay is not None:
        return (
            f"the leader lock (key {key}), held by {relay} (host {host}, pid {pid}, term {term}, "
            f"last seen {silent:.1f} s ago)"
        )
    who = f"{application or 'no application name'}" + (f" from {client}" if client else "")
    return f"the leader lock (key {key}), held by PostgreSQL backend {backend} ({who}), not a registered relay"


async def run_until_published(
    settings: Settings,
    count: int,
    *,
    max_seconds: float = 60.0,
    on_batch: Callable[[list[int]], None] | None = None,
    **relay_options: Any,
) -> Relay:
    """Run a relay in-process until it has published ``count`` rows (or ``max_seconds`` pass), then stop it.

    For benchmarks and tools: returns the stopped :class:`Relay` (``published_total``
    says how many rows it published). Raises TimeoutError if fewer were published in time.
    """
    signals = RelaySignals(published=asyncio.Queue())
    relay = Relay(settings, signals=signals, **relay_options)
    task = asyncio.create_task(relay.run())
    published = 0
    assert signals.published is not None
    try:
        async with asyncio.timeout(max_seconds):
            while published < count:
                getter = asyncio.ensure_future(signals.published.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    task.result()  # the relay ended: raise its error
                    raise RuntimeError("relay stopped before publishing every row")
                ids = getter.result()
                published += len(ids)
                if on_batch is not None:
                    on_batch(ids)
    finally:
        relay.stop()
        await task
    return relay
