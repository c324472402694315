"""The worker: one asyncio object that wires consumer, claims, executor, completer,
reclaimer, heartbeat and control together.

The wiring only: each subsystem is a module of its own, constructed and connected
here — the hand-back of jobs this worker cannot run (:mod:`postbox.worker.handback`),
the limited claim (:mod:`postbox.worker.flow`), limited jobs waiting here for
their reservation (:mod:`postbox.worker.flow_wait`), and the runs taken over from
lost runs, each alone (:mod:`postbox.worker.isolation`).

``await Worker(settings).run()`` until :meth:`Worker.stop` (the CLI calls it on
SIGTERM/SIGINT): reading stops, in-flight jobs get up to ``drain_timeout`` to
finish and record their outcomes, and whatever is still unfinished is left
unacknowledged for another worker. Tests and the bench use it in-process,
with :class:`~postbox.worker.signals.WorkerSignals` to wait on events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from postbox import db, definitions, events, redis_conn, revision, socket_wait
from postbox import flow as flow_limits
from postbox.cancellation import cancel_all
from postbox.errors import SettingsError
from postbox.pool import StackPool
from postbox.progress import Progress
from postbox.registry import Registry, default_registry
from postbox.settings import Settings
from postbox.streams import PRIORITIES, all_streams, ready_key, stream_key
from postbox.worker import claims, control
from postbox.worker import flow as flow_claims
from postbox.worker.capacity import Capacity
from postbox.worker.completer import Completer, Finished
from postbox.worker.consumer import Consumer, ensure_groups
from postbox.worker.delivery import Delivery, Job
from postbox.worker.executor import Executor
from postbox.worker.flow_wait import FlowWaits
from postbox.worker.handback import Handback
from postbox.worker.heartbeat import Heartbeat
from postbox.worker.isolation import Isolation
from postbox.worker.metrics import WorkerMetrics
from postbox.worker.reclaimer import Reclaimer
from postbox.worker.signals import WorkerSignals, fire
from postbox.worker.threads import HandlerThreads

log = logging.getLogger(__name__)

MAX_READ = 1000  # most entries taken by one read, whatever the free capacity
MAX_DISPATCHES = 2  # claims in flight at once (the next read overlaps the last claim)
IDLE_BLOCK = 1.0  # seconds a drained consumer blocks before looking again
UNBLOCK_GRACE = 5.0  # seconds a stopping worker waits for its ended wait's read to answer
START_RETRY_SECONDS = 60.0  # how long the start-up writes are retried while the database is unavailable
START_RETRY_INTERVAL = 0.5
# The worker's pool: its own connections (claims, outcomes, control) and, above them, at most
# HANDLER_CONNECTIONS for its handlers' ctx.transaction()s, fewer with a smaller concurrency.
OWN_CONNECTIONS = 4
HANDLER_CONNECTIONS = 20
UNMARKED_FIRST_LOOK = 0.01  # seconds before looking again at a limited job read before its publish's mark


def _describe(limits: flow_limits.Limits) -> str:
    parts = [f"queue {name}: {flow_limits.describe_text(lim)}" for name, lim in sorted(limits.queues.items())]
    parts += [f"task {name}: {flow_limits.describe_text(lim)}" for name, lim in sorted(limits.tasks.items())]
    return "; ".join(parts) or "none"


def new_worker_id() -> str:
    return f"worker-{secrets.token_hex(4)}"


def handler_gate(concurrency: int) -> asyncio.Semaphore:
    """The line a worker's ctx.transaction()s wait in for their connections: as wide as the handlers' share.

    With more jobs running at once than the pool has connections for handlers (a
    concurrency above 20, or takeovers run past the concurrency), a job's transaction
    used to wait in psycopg_pool's own line for a connection, a lock, a future and a
    timeout per checkout: about a tenth of the worker's CPU per ``ctx.transaction()``
    job at concurrency 50 (docs/benchmarks.md, twenty-first round); and the jobs could
    take the connections kept for the worker's claims and outcomes. They now wait here,
    and reach the pool only when a connection is free for them. This line has no
    timeout of its own (the pool's still bounds a checkout from it): a job waits as long
    as the jobs ahead of it hold theirs, and its task's timeout bounds that wait.
    """
    return asyncio.Semaphore(min(concurrency, HANDLER_CONNECTIONS))


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        registry: Registry | None = None,
        signals: WorkerSignals | None = None,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.registry = registry or default_registry
        self.signals = signals or WorkerSignals()
        self.id = worker_id or new_worker_id()
        self.queues: list[str] = list(settings.queues) or self.registry.queues()
        if not self.queues:
            raise SettingsError("POSTBOX_QUEUES: no queues to consume (load task modules with --tasks, or name queues)")
        self.metrics = metrics or WorkerMetrics()
        self.capacity = Capacity(settings.concurrency)
        self.running: dict[int, Job] = {}  # claimed attempts whose outcome is not yet acknowledged
        self.executing = 0  # handlers running now (the in-flight gauge reads it when scraped)
        self.metrics.in_flight.set_function(lambda: self.executing)
        self.paused: set[str] = set()
        self.processed = 0
        self.failed = 0
        self.ready = asyncio.Event()
        self._rand = rand
        self._clock = clock
        self._stopping = asyncio.Event()
        self._abort = asyncio.Event()
        self._last_dispatch: asyncio.Future[None] | None = None
        self._lost_watch: dict[tuple[str, bytes], float] = {}  # vanished entries of running jobs
        self._lease = settings.visibility_timeout
        self._claim_bounds = db.claim_bounds(settings.visibility_timeout)
        self._prefix = settings.redis_prefix
        self._streams: tuple[frozenset[str], list[str], dict[str, int]] | None = None  # active_streams()
        self.limits = flow_limits.Limits()  # in force (declared + overrides), refreshed with the control poll
        self._limits_at = -float("inf")  # monotonic time of the last load (the claim reloads a stale copy)
        self._limits_loaded = False
        self._releases: set[asyncio.Task[None]] = set()
        self.flow_waits = FlowWaits(
            capacity=self.capacity, stopping=self._stopping, dispatch=self._dispatch_logged, lease=self._lease
        )

    # --- lifecycle -------------------------------------------------------------------

    def stop(self) -> None:
        """Stop reading and drain (safe to call from a signal handler on the loop).

        Called again while draining, it ends the drain at once: unfinished jobs
        are left unacknowledged for another worker, as at the drain timeout.
        """
        if self._stopping.is_set():
            self._abort.set()
        self._stopping.set()
        self.capacity.wake()
        self.flow_waits.stop()  # jobs waiting here for their reservation stay pending for another worker

    async def wait_idle(self) -> None:
        """Return once every outcome and acknowledgement handed to the completer is done (tests)."""
        await self._completer.wait_idle()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        s = self.settings
        redis = redis_conn.connect(s, decode_responses=False)
        pool: AsyncConnectionPool[Any] = StackPool(  # the connection returned last first (postbox.pool)
            s.require_database_url(),
            connection_class=socket_wait.Connection,  # one epoll registration per session, not per round trip
            min_size=2,
            max_size=min(s.concurrency, HANDLER_CONNECTIONS) + OWN_CONNECTIONS,
            kwargs={"autocommit": True, "application_name": f"postbox-{self.id}"},
            configure=db.worker_bounds(s.visibility_timeout).configure,  # docs/operations.md#session-bounds
            open=False,
        )
        threads = HandlerThreads(self.id)
        self.threads = threads
        background: list[asyncio.Task[None]] = []
        try:
            await pool.open(wait=True, timeout=30)

            async def check_revision() -> None:  # this code's statements need the newest migration
                async with pool.connection() as conn:
                    await revision.require(conn)

            # Retried like the other start-up steps: a database failing over while this worker
            # starts ended it here before (a wrong revision is not transient: it ends the start).
            await self._retry_at_start(check_revision, (psycopg.OperationalError, PoolTimeout), "database")
            await self._ensure_groups_at_start(redis)
            self._redis = redis
            self._pool = pool
            self._claimer = claims.Claimer(pool, worker_id=self.id, lease=self._lease)
            self._consumer = Consumer(redis, consumer=self.id, ready=ready_key(self._prefix), wake_prefix=self._prefix)
            self._reclaimer = Reclaimer(
                redis, pool, prefix=self._prefix, consumer=self.id, min_idle=s.visibility_timeout
            )
            self._heartbeat = Heartbeat(
                pool, redis, worker_id=self.id, queues=self.queues, concurrency=s.concurrency, lease=self._lease
            )
            self._executor = Executor(
                settings=s,
                registry=self.registry,
                pool=pool,
                transactions=handler_gate(s.concurrency),
                worker_id=self.id,
                threads=threads,
                on_start=self._on_start,
                on_progress=self._on_progress,
                rand=self._rand,
            )
            self._completer = Completer(
                pool=pool,
                redis=redis,
                prefix=self._prefix,
                worker_id=self.id,
                result_ttl=self._executor.result_ttl,
                on_done=self._on_done,
            )
            self._handback = Handback(
                pool=pool,
                registry=self.registry,
                arguments=self._executor.arguments,
                worker_id=self.id,
                grace=s.unknown_task_grace,
                on_skipped=self._skip,
                clock=self._clock,
            )
            self._isolation = Isolation(
                pool=pool,
                capacity=self.capacity,
                stopping=self._stopping,
                running=self.running,
                start=self._start_run,
                worker_id=self.id,
                alone_within=s.visibility_timeout,
            )
            await self._announce(pool)
            completer_task = asyncio.create_task(self._completer.run(), name="completer")
            heartbeat = self._forever(self._tick_heartbeat, self._heartbeat_every(), reader=False)
            controls = self._forever(self._poll_control, control.POLL_INTERVAL, reader=False)
            reclaims = self._forever(self._reclaim_once, self._reclaim_every(), reader=True)
            background = [
                completer_task,
                asyncio.create_task(heartbeat, name="heartbeat"),
                asyncio.create_task(controls, name="control"),
            ]
            readers = [
                asyncio.create_task(self._consume(), name="consumer"),
                asyncio.create_task(reclaims, name="reclaimer"),
            ]
            log.info(
                "worker started",
                extra={"worker_id": self.id, "queue": ",".join(self.queues), "count": s.concurrency},
            )
            self.ready.set()
            await self._stopping.wait()
            log.info("stopping: no more reads, draining in-flight jobs", extra={"worker_id": self.id})
            await asyncio.gather(*readers, return_exceptions=True)
            await self._drain()
            await self._completer.close()
            await self.flow_waits.join()
            if self._releases:
                await asyncio.gather(*self._releases, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._heartbeat.stopped(self.processed, self.failed)
        finally:
            isolation = getattr(self, "_isolation", None)
            if isolation is not None and isolation.task is not None:
                background.append(isolation.task)
            await cancel_all(background)
            threads.shutdown()
            claimer = getattr(self, "_claimer", None)
            if claimer is not None:
                with contextlib.suppress(Exception):
                    await claimer.close()
            await pool.close()
            await redis.aclose()
            log.info("worker stopped", extra={"worker_id": self.id})

    async def _drain(self) -> None:
        tasks = [job.task for job in self.running.values() if job.task is not None and not job.task.done()]
        if not tasks:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_timeout
        abort: asyncio.Future[Any] = asyncio.ensure_future(self._abort.wait())
        pending: set[asyncio.Future[Any]] = set(tasks)
        try:
            while pending and not abort.done() and loop.time() < deadline:
                done, _ = await asyncio.wait(
                    pending | {abort}, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
                )
                pending -= done
        finally:
            abort.cancel()
        unfinished = [t for t in tasks if not t.done()]
        if unfinished:
            log.warning(
                "drain timeout: leaving unfinished jobs unacknowledged for another worker",
                extra={"count": len(unfinished)},
            )
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)

    def _heartbeat_every(self) -> float:
        return max(0.05, min(self.settings.heartbeat_interval, self.settings.visibility_timeout / 3))

    def _reclaim_every(self) -> float:
        return max(0.05, min(1.0, self.settings.visibility_timeout / 4))

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _announce(self, pool: AsyncConnectionPool[Any]) -> None:
        """The start-up writes: the first heartbeat, the tasks' definitions and flow claims, the controls.

        Retried while the database is unavailable or busy (a restart or a failover
        under way, another worker's start-up holding a limit row past the lock
        timeout): each write is an upsert, so a repeat is harmless.
        """

        async def writes() -> None:
            await self._heartbeat.beat(0, 0, 0)
            async with pool.connection() as conn:  # what postbox.enqueue() in SQL applies to these tasks
                await definitions.publish(conn, self.registry, by=self.id)
                await flow_claims.publish(conn, self.registry, by=self.id)
            await self._poll_control()

        await self._retry_at_start(writes, (psycopg.OperationalError, PoolTimeout), "database")

    async def _ensure_groups_at_start(self, redis: redis_conn.AnyRedis) -> None:
        """The consumer groups of every stream this worker reads, retried while Redis is unavailable
        (a restart, or a cluster still settling a failover: a node answers CLUSTERDOWN until it learns
        of the promotion, and MOVED from a slot map read before it)."""
        await self._retry_at_start(
            lambda: ensure_groups(redis, all_streams(self._prefix, self.queues)),
            (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, MovedError, AskError, OSError),
            "Redis",
        )

    async def _retry_at_start(
        self, step: Callable[[], Coroutine[Any, Any, None]], transient: tuple[type[BaseException], ...], what: str
    ) -> None:
        """Run a start-up ``step``, again every :data:`START_RETRY_INTERVAL` s while it fails with ``transient``,
        for up to :data:`START_RETRY_SECONDS`; a worker that cannot start in that time exits with the error."""
        deadline = time.monotonic() + START_RETRY_SECONDS
        while True:
            try:
                await step()
                return
            except transient as exc:
                if time.monotonic() >= deadline or self._stopping.is_set():
                    raise
                log.warning(
                    f"{what} unavailable while starting; retrying",
                    extra={"worker_id": self.id, "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__},
                )
                await asyncio.sleep(START_RETRY_INTERVAL)

    async def _forever(self, step: Callable[[], Coroutine[Any, Any, None]], every: float, *, reader: bool) -> None:
        """Run ``step`` every ``every`` seconds; readers end when stopping, the rest when cancelled."""
        while not (reader and self._stopping.is_set()):
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; retrying", getattr(step, "__name__", "step"))
            if reader:
                await self._sleep(every)
            else:
                await asyncio.sleep(every)

    # --- reading ---------------------------------------------------------------------

    def active_streams(self) -> list[str]:
        """Streams to read, highest priority first across the worker's unpaused queues (do not modify).

        Built again only when the paused queues change: over 100 queues it is a
        list of 1,000 keys, asked for at every read.
        """
        paused = frozenset(self.paused)
        if self._streams is None or self._streams[0] != paused:
            queues = [q for q in self.queues if q not in paused]
            streams = [stream_key(self._prefix, q, p) for p in PRIORITIES for q in queues]
            self._streams = (paused, streams, {key: index for index, key in enumerate(streams)})
        return self._streams[1]

    def _woken_streams(self, woken: set[str]) -> list[str]:
        """The active streams among ``woken``, in read (priority) order."""
        assert self._streams is not None
        order = self._streams[2]
        return sorted((key for key in woken if key in order), key=order.__getitem__)

    async def _consume(self) -> None:
        delay = 0.05
        dispatching: set[asyncio.Task[None]] = set()
        # After a wake-up, the streams it named (None: read every stream). The drained read
        # before it took every stream's tail atomically, so only those streams can hold new
        # entries then; entries added to others afterwards are newer than their tails in
        # ``tails_seen``, so the next wait returns at once and the read after it takes them.
        woken: set[str] | None = None
        tails_seen: dict[str, str] = {}
        tails_for: list[str] | None = None  # the active streams ``tails_seen`` covers
        # The last read drained the streams and the consumer can wait and read in one send
        # (Consumer.wait_then_read): the next read is made on the wake-up, by Redis.
        read_on_wake = False
        stopped = asyncio.ensure_future(self._stopping.wait())  # ends a wait for new entries
        try:
            while not self._stopping.is_set():
                try:
                    if self.capacity.free <= 0:
                        woken = None  # the read comes later: look at every stream then
                    await self.capacity.wait_free()
                    if self._stopping.is_set():
                        return
                    if self.capacity.free <= 0:
                        continue
                    if dispatching and self.capacity.free < max(1, self.capacity.size // 4):
                        # A claim is in flight: overlap the next read only with a worthwhile batch.
                        woken = None
                        await asyncio.wait(dispatching, return_when=asyncio.FIRST_COMPLETED)
                        continue
                    streams = self.active_streams()
                    if not streams:
                        await self._sleep(control.POLL_INTERVAL / 2)
                        continue
                    read_from = streams
                    if woken and tails_for is streams:
                        read_from = self._woken_streams(woken) or streams
                    woken = None
                    if read_on_wake and tails_for is streams and self._consumer.reads_on_wake(streams):
                        # No capacity is held during the wait (a finished limited job's slot may be
                        # refilled from its parking meanwhile): the read's count is what is free now,
                        # and what it brings is counted when it comes.
                        deliveries, malformed, tails = await self._consumer.wait_then_read_until(
                            tails_seen, streams, min(self.capacity.free, MAX_READ), IDLE_BLOCK, stopped, UNBLOCK_GRACE
                        )
                        self.capacity.add(len(deliveries))
                        deliveries = self._not_paused(deliveries)
                    else:
                        taken = self.capacity.take(min(self.capacity.free, MAX_READ))
                        try:
                            deliveries, malformed, tails = await self._consumer.read(
                                read_from, taken, whole=read_from is streams
                            )
                        except BaseException:
                            self.capacity.release(taken)
                            raise
                        self.capacity.release(taken - len(deliveries))
                    read_on_wake = False
                    if tails and read_from is not streams:
                        tails = {**tails_seen, **tails}
                    tails_seen, tails_for = (tails, streams) if tails else ({}, None)
                    self._drop_malformed(malformed)
                    if deliveries:
                        # Claim in the background and read on: the next read overlaps this claim.
                        task = asyncio.create_task(self._dispatch_logged(deliveries))
                        dispatching.add(task)
                        task.add_done_callback(dispatching.discard)
                        if len(dispatching) >= MAX_DISPATCHES:
                            await asyncio.wait(dispatching, return_when=asyncio.FIRST_COMPLETED)
                        else:
                            # One turn of the loop for the claim's task: the claim goes out before
                            # the next read or wait is sent, not after (docs/benchmarks.md, eleventh round).
                            await asyncio.sleep(0)
                    if tails:
                        # This read drained the streams (it found fewer entries than it asked
                        # for): wait for an entry newer than their tails rather than read again
                        # and find nothing. One Redis round trip less per wake-up at low rates;
                        # two where the read rides with the wake-up (the next turn).
                        if self._consumer.reads_on_wake(streams):
                            read_on_wake = True
                        else:
                            # The streams that answered (None: unknown, or stopping). The wait
                            # watches ``stopped`` itself, in this task: no task around it.
                            woken = await self._consumer.wait_for_new(tails, IDLE_BLOCK, stopped, streams)
                    delay = 0.05
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("reading streams failed; retrying")
                    await self._sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            stopped.cancel()
            await asyncio.gather(stopped, return_exceptions=True)
            await self._consumer.close()
            if dispatching:
                await asyncio.gather(*dispatching, return_exceptions=True)

    async def _dispatch_logged(self, deliveries: list[Delivery]) -> None:
        try:
            await self._dispatch(deliveries)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("claiming a batch failed; its entries stay pending and will be reclaimed")

    def _not_paused(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Deliveries of a queue paused while they were read are left pending, their capacity released.

        They are reclaimed, like any idle entry, once the queue is read again.
        """
        if not self.paused or not deliveries:
            return deliveries
        kept = [d for d in deliveries if d.queue not in self.paused]
        if len(kept) < len(deliveries):
            self.capacity.release(len(deliveries) - len(kept))
            log.info(
                "entries of a queue paused during the wait left pending",
                extra={"count": len(deliveries) - len(kept), "worker_id": self.id},
            )
        return kept

    async def _rescue(self, deleted: dict[str, list[bytes]]) -> None:
        """Rescue jobs whose entries vanished; watch those still running under a live claim."""
        now = time.monotonic()
        for stream, ids in deleted.items():
            for entry_id in ids:
                self._lost_watch.setdefault((stream, entry_id), now + 3 * self.settings.visibility_timeout)
        due: dict[str, list[bytes]] = {}
        for (stream, entry_id), until in list(self._lost_watch.items()):
            if until < now:
                del self._lost_watch[(stream, entry_id)]  # the relay's sweep is the backstop
            else:
                due.setdefault(stream, []).append(entry_id)
        if not due:
            return
        rescued, still_running = await self._reclaimer.rescue_lost(due)
        for stream, ids in due.items():
            keep = set(still_running.get(stream, []))
            for entry_id in ids:
                if entry_id not in keep:
                    self._lost_watch.pop((stream, entry_id), None)
        if rescued:
            fire(self.signals.lost, rescued)

    async def _reclaim_once(self) -> None:
        if self._stopping.is_set():
            return
        if self._lost_watch:
            await self._rescue({})
        # Which streams hold idle entries is asked first, holding no capacity: the pass
        # over all the worker's streams must not keep its reads waiting (a pass of one
        # XAUTOCLAIM per stream held the whole capacity for 0.5-1.1 s every second over
        # 1,000 streams, and jobs waited that long to start).
        streams = await self._reclaimer.idle_streams(self.active_streams())
        if not streams or self._stopping.is_set():
            return
        # Takeovers do not wait for a free slot: under a backlog one may never be free
        # when this runs. They may overcommit the worker (up to twice its concurrency);
        # new reads wait until it is back under its concurrency.
        taken = self.capacity.take_over(min(self.capacity.size, MAX_READ))
        if taken == 0:
            return
        try:
            got = await self._reclaimer.reclaim(streams, taken)
        except BaseException:
            self.capacity.release(taken)
            raise
        self.capacity.release(taken - len(got.deliveries))
        self._drop_malformed(got.malformed)
        await self._rescue(got.deleted)
        if got.deliveries:
            log.info("reclaimed idle entries", extra={"count": len(got.deliveries), "worker_id": self.id})
            fire(self.signals.reclaimed, [d.job_id for d in got.deliveries])
            await self._dispatch(got.deliveries)

    def _drop_malformed(self, malformed: list[tuple[str, bytes]]) -> None:
        for stream, entry_id in malformed:
            log.error("dropping a stream entry that is not a postbox job", extra={"queue": stream})
            self._completer.add(Finished(Delivery(stream, entry_id, 0, "", "", "", "", 0, 0)))

    def _skip(self, delivery: Delivery) -> None:
        """A delivery that does not run here: its entry is acknowledged with the next batch."""
        self._completer.add(Finished(delivery))
        fire(self.signals.skipped, delivery.job_id)

    async def _dispatch(self, deliveries: list[Delivery]) -> None:
        """Claim what was read (capacity for all of it is held) and start what may run.

        Claims of consecutive reads may overlap; their jobs still start in read order.
        """
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        previous, self._last_dispatch = self._last_dispatch, mine
        try:
            try:
                kept = await self._handback.screen(deliveries)
                self.capacity.release(len(deliveries) - len(kept))
                deliveries = kept
                batch = await self._claim(deliveries)
            except BaseException:
                self.capacity.release(len(deliveries))
                raise  # the entries stay pending; they are reclaimed after the visibility timeout
            if previous is not None and not previous.done():
                await asyncio.shield(previous)
            self._start(batch, len(deliveries))
        finally:
            if not mine.done():
                mine.set_result(None)

    async def _claim(self, deliveries: list[Delivery]) -> claims.ClaimBatch:
        """Claim: jobs under no limit the plain way, the others under their limits (worker/flow.py).

        Which jobs are limited comes from this worker's copy of the limits, reloaded
        first when it is older than two control polls (the worker was frozen, or its
        reloads failed); what a limited job may do is decided on the limits read in
        the claim's own transaction.
        """
        if time.monotonic() - self._limits_at > 2 * control.POLL_INTERVAL:
            with contextlib.suppress(Exception):  # the claim itself reports a database failure
                await self._reload_limits()
        limits = self.limits
        if not limits:
            return await self._claimer.claim(deliveries)
        plain: list[Delivery] = []
        limited: list[Delivery] = []
        for delivery in deliveries:
            if limits.limited(delivery.queue, delivery.task):
                limited.append(delivery)
            else:
                plain.append(delivery)
        if not limited:
            return await self._claimer.claim(plain)
        batch = await self._claimer.claim(plain)
        got = await flow_claims.claim(
            self._pool,
            limited,
            worker_id=self.id,
            lease=self._lease,
            recheck=self._flow_recheck(),
            short_wait=self.flow_waits.short_wait(),
            relay_poll=self.settings.poll_interval,
            bounds=self._claim_bounds,
        )
        for delivery in got.held:
            self.metrics.count(delivery.queue, delivery.task, "held")
            self._completer.add(Finished(delivery))
            fire(self.signals.held, delivery.job_id)
        for delivery, delay in got.waiting:
            self.metrics.count(delivery.queue, delivery.task, "held")
            fire(self.signals.held, delivery.job_id)
            self.flow_waits.add(delivery, delay)
        for delivery in got.unmarked:
            # Read before the relay's mark committed: look again shortly, backing off (a
            # big batch's mark can take a while on a loaded server), and past a quarter of
            # the visibility timeout leave the entry pending for the reclaimer.
            delay = UNMARKED_FIRST_LOOK * 2**delivery.looks
            delivery.looks += 1
            if sum(UNMARKED_FIRST_LOOK * 2**n for n in range(delivery.looks)) <= self._lease / 4:
                self.flow_waits.add(delivery, min(delay, 1.0))
        batch.run += got.batch.run
        batch.ended += got.batch.ended
        batch.skip += got.batch.skip
        batch.keep += got.batch.keep
        return batch

    def _flow_recheck(self) -> float:
        """Seconds a job parked on a full key waits at most before it is looked at again."""
        return max(1.0, self._lease)

    def _start(self, batch: claims.ClaimBatch, read: int) -> None:
        self.capacity.release(read - len(batch.run))
        for delivery in batch.skip:
            self.metrics.count(delivery.queue, delivery.task, "skipped")
            self._skip(delivery)
        for delivery, state in batch.ended:
            self.metrics.count(delivery.queue, delivery.task, state)
            self._completer.add(Finished(delivery, ended_state=state))
        if batch.run:
            fire(self.signals.claimed, [job.id for job in batch.run])
        for job in batch.run:
            self.running[job.id] = job
            if not self._isolation.place(job):  # a takeover runs alone; others wait for it
                self._start_run(job)
        self._isolation.begin()

    # --- running ---------------------------------------------------------------------

    def _on_start(self, job: Job) -> None:
        d = job.delivery
        self.metrics.count(d.queue, d.task, "started")
        self.metrics.latency.observe((d.queue, d.task), max(0.0, time.time() - job.enq_ms / 1000))
        if self._completer.events_maybe_wanted():
            self._completer.publish(
                events.event(
                    "started", job_id=d.job_id, queue=d.queue, task=d.task, attempt=job.attempt, worker_id=self.id
                )
            )
        fire(self.signals.started, d.job_id)

    def _on_progress(self, job: Job, value: Progress) -> None:
        """A run's progress was written: tell the events' subscribers (best effort, as every event)."""
        if self._completer.events_maybe_wanted():
            d = job.delivery
            self._completer.publish(
                events.event(
                    "progress",
                    job_id=d.job_id,
                    queue=d.queue,
                    task=d.task,
                    attempt=job.attempt,
                    worker_id=self.id,
                    progress=value.as_json(),
                )
            )

    def _start_run(self, job: Job) -> None:
        job.task = asyncio.create_task(self._execute(job))

    async def _execute(self, job: Job) -> None:
        started = time.monotonic()
        self.executing += 1
        if self.executing == 1:
            self._isolation.run_started()
        try:
            try:
                outcome = await self._executor.run(job)
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # a bug must not leave the job running with no outcome
                log.exception(
                    "running the job failed inside the worker; recording a failure",
                    extra={"outbox_id": job.id, "task": job.delivery.task, "attempt": job.attempt},
                )
                outcome = self._executor.failed_inside(job, exc)
        except asyncio.CancelledError:
            # Shut down past the drain timeout: nothing recorded, never acknowledged.
            if self.running.get(job.id) is job:
                del self.running[job.id]
            raise
        finally:
            self.capacity.release(1)
            self.executing -= 1
            if self.executing == 0:
                self._isolation.run_ended(0)
        d = job.delivery
        self.metrics.duration.observe((d.queue, d.task), time.monotonic() - started)
        self._completer.add(Finished(d, job, outcome))

    def _on_done(self, items: list[Finished]) -> None:
        counts: Counter[tuple[str, str, str]] = Counter()  # one metric update per label set and batch
        slots = [f.job for f in items if f.job is not None and f.job.flow_slots and f.recorded]
        if slots:
            releasing = asyncio.create_task(self._release(slots))
            self._releases.add(releasing)
            releasing.add_done_callback(self._releases.discard)
        for f in items:
            d = f.delivery
            if f.job is None:
                if f.ended_state is not None:
                    fire(self.signals.finished, (d.job_id, f.ended_state))
                continue
            if self.running.get(f.job.id) is f.job:
                del self.running[f.job.id]
            outcome = f.outcome
            assert outcome is not None
            kind = outcome.kind if f.recorded else "lost"
            counts[d.queue, d.task, outcome.metric if f.recorded else "lost"] += 1
            if f.recorded:
                if outcome.state in ("succeeded", "cancelled"):
                    self.processed += 1
                else:
                    self.failed += 1
            fire(self.signals.finished, (d.job_id, kind))
        for (queue, task, metric), amount in counts.items():
            self.metrics.count(queue, task, metric, amount)

    async def _release(self, jobs: list[Job]) -> None:
        """Release the slots of finished limited jobs, and fill them: first with jobs parked
        on those keys that this worker can run now (taken straight from their parking, no
        round trip through the relay and Redis), then by waking as many others for any worker.

        Best effort: a slot not released here is dead anyway (its job no longer runs)
        and is cleared by the next claim on its key; a parked job not woken is looked
        at again at its recheck.
        """
        try:
            freed = await flow_claims.release(self._pool, jobs)
            if not freed:
                return
            left = dict(freed)
            if not self._stopping.is_set() and self.capacity.free > 0:
                found = await flow_claims.parked(self._pool, freed, self._prefix)
                mine = [
                    (key, d)
                    for key, d in found
                    if d.task in self.registry and d.queue in self.queues and d.queue not in self.paused
                ]
                taken = mine[: self.capacity.take(len(mine))]
                if taken:
                    await self._dispatch([d for _, d in taken])
                    for key, d in taken:
                        job = self.running.get(d.job_id)
                        if job is not None and job.delivery is d:
                            left[key] -= 1  # started here: that slot is filled
            woken = await flow_claims.wake(self._pool, left)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("releasing flow-control slots failed; parked jobs wait for their recheck")
            return
        fire(self.signals.released, woken)

    # --- periodic --------------------------------------------------------------------

    async def _tick_heartbeat(self) -> None:
        await self._heartbeat.renew(self.running.values())
        if self.flow_waits:
            await self._heartbeat.touch(self.flow_waits.deliveries())
        await self._heartbeat.beat(len(self.running), self.processed, self.failed)

    async def _reload_limits(self) -> None:
        """Load the limits in force; a limit raised or lifted wakes the jobs parked on it."""
        started = time.monotonic()
        async with self._pool.connection() as conn:
            limits = await flow_claims.load(conn, self.queues, self.registry.names())
        self._limits_at = started
        if limits == self.limits and self._limits_loaded:
            return
        before, first = self.limits, not self._limits_loaded
        self.limits, self._limits_loaded = limits, True
        if not first or limits:
            log.info("limits in force: %s", _describe(limits), extra={"worker_id": self.id})
        try:
            woken = await flow_claims.wake_to_limit(self._pool, flow_claims.raised(before, limits))
        except Exception:
            log.exception("waking parked jobs after a limit change failed; they wait for their recheck")
            return
        if woken:
            log.info("limit raised: woke %d parked jobs", woken, extra={"worker_id": self.id})

    async def _poll_control(self) -> None:
        running = [job_id for job_id, job in self.running.items() if job.task is not None and not job.task.done()]
        paused, cancel = await control.poll(self._pool, self.queues, running)
        await self._reload_limits()
        if paused != self.paused:
            log.info("paused queues: %s", ",".join(sorted(paused)) or "none", extra={"worker_id": self.id})
            self.paused = paused
            with contextlib.suppress(Exception):  # a wait reading the queue just paused reads no longer
                await self._consumer.interrupt_wait()
        for job_id in cancel:
            job = self.running.get(job_id)
            if job is None or job.cancel_requested:
                continue
            job.cancel_requested = True
            # Async handlers are cancelled at their next await; a sync handler's job ends
            # now and its thread, which cannot be stopped, is abandoned (worker/threads.py).
            if job.task is not None and not job.task.done():
                job.task.cancel()
