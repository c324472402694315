"""Recovery from Redis data loss, and from entries that vanished one by one.

PostgreSQL decides what is done; Redis is only transport. Two mechanisms:

1. **Loss detection** (:meth:`Reconciler.check`, about once a second, and
   more often over many streams: each check looks at a slice of them, so that
   every stream is looked at about once a second; relay/stream_check.py): the
   epoch key (:func:`postbox.streams.epoch_key`) holds a random token the leader
   set; if it vanished, or a stream the relay created is gone, Redis lost data
   (restart without persistence, FLUSHALL, failover, eviction). The relay then
   republishes — bounded by ``republish_rate`` rows/s — every row that was
   ``queued`` when the loss was noticed, and every ``running`` row whose claim
   went stale. A failover to a replica that missed the last writes keeps the
   epoch and the streams but not their newest entries: each stream's
   ``last-generated-id`` older than the newest id the relay wrote to it
   (:mod:`postbox.relay.watermark`) is a loss too, found by the same check; so
   is a batch whose count came back short (on one server every batch's write
   ends with an ``INCRBY`` of a counter: that is noticed at the first write
   after the failover, which the look could miss). A new
   leader starts its marks from the entries recorded for the newest in-flight
   rows, so a tail lost together with the previous leader is noticed too. While
   a recovery runs the key reads ``recovering:<token>``; a leader that finds
   it so (the previous one died mid-way) starts the recovery again.
2. **Entry sweep** (:meth:`Reconciler.sweep`, every ``sweep_interval``): for a
   bounded slice of ``queued`` rows older than ``sweep_min_age`` and ``running``
   rows with a stale claim, check with XRANGE that the stream entry recorded in
   ``stream_id`` (by the publish, or by the claim: the entry the run came in)
   still exists and is this job's (after a failover the stream's ids start again
   from an older point, so an id can come back holding another job); republish
   the rows whose entry is gone, and the running ones that name no entry.

A finished row (succeeded, dead, cancelled, expired) is never selected, and
each republish re-reads the state right before its XADD.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from postbox import sql
from postbox.redis_conn import AnyRedis, is_cluster
from postbox.relay.publisher import Publisher, Row, check_term
from postbox.relay.stream_check import LOOK_SLICE, StreamCheck, StreamReport
from postbox.streams import decode_entry, epoch_key, stream_key

log = logging.getLogger(__name__)

RECOVERING = "recovering:"


class RateLimiter:
    """Token bucket: at most ``rate`` grants per second, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self.burst = max(1, burst)
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, wanted: int) -> int:
        """Grant up to ``wanted`` tokens now (possibly 0)."""
        self._refill()
        granted = max(0, min(wanted, int(self.tokens)))
        self.tokens -= granted
        return granted

    def wait_time(self) -> float:
        """Seconds until at least one token is available."""
        self._refill()
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate


def holds_job(entries: Any, job_id: int) -> bool:
    """Whether an XRANGE answer for one entry id is the entry of job ``job_id``."""
    if isinstance(entries, BaseException):
        return True  # unknown: the next sweep asks again
    if not entries:
        return False
    _sid, fields = entries[0]
    try:
        return int(decode_entry(fields)["id"]) == job_id
    except (KeyError, TypeError, ValueError):
        return False


class Reconciler:
    def __init__(
        self,
        redis: AnyRedis,
        prefix: str,
        publisher: Publisher,
        *,
        rate: int,
        batch_size: int,
        sweep_interval: float = 5.0,
        sweep_min_age: float = 5.0,
        sweep_batch: int = 500,
        seed_rows: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        on_republished: Callable[[list[int]], None] | None = None,
        on_loss: Callable[[], None] | None = None,
        on_finding: Callable[[], None] | None = None,
        before_look: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.redis = redis
        self.key = epoch_key(prefix)
        self.publisher = publisher
        self.batch_size = batch_size
        self.limiter = RateLimiter(rate, min(rate, batch_size), clock)
        self.sweep_interval = sweep_interval
        self.sweep_min_age = sweep_min_age
        self.sweep_batch = sweep_batch
        self.seed_rows = seed_rows
        self.clock = clock
        self.on_republished = on_republished
        self.on_loss = on_loss
        self.token: str | None = None  # the epoch token this leader set or adopted
        self.cutoff: datetime | None = None  # set while a recovery runs
        self.cursor = 0
        self.sweep_cursor = 0
        self.next_sweep = clock() + sweep_interval
        self.republished_total = 0
        self.sweeps = 0  # sweeps completed (tests wait on it)
        self._recovered = 0
        self._xinfo_refused = False  # said once: this server refuses XINFO
        self._look_after: str | None = None  # where the next slice of the stream check starts
        self._streams = 0  # streams the last look had to look at
        self.stream_check = StreamCheck(redis)
        # One server: looks run beside the publishing (check()); this wakes the publishing loop
        # when one found a loss or failed.
        self._background = not is_cluster(redis)
        self._behind: asyncio.Task[tuple[str | None, StreamReport]] | None = None
        self._awaited_next = False  # after a Redis error: the next check before publishing (redis_failed)
        self._due_behind = False  # a look fell due while the previous one was under way
        self._dropped: set[asyncio.Task[Any]] = set()  # cancelled looks not yet ended (close())
        self.on_finding = on_finding
        self.before_look = before_look  # test hook: awaited as a look beside the publishing begins

    @property
    def recovering(self) -> bool:
        return self.cutoff is not None

    def busy(self) -> bool:
        """True when a recovery has rows left and tokens to spend right now."""
        return self.recovering and self.limiter.wait_time() == 0

    def wait_hint(self) -> float | None:
        return self.limiter.wait_time() if self.recovering else None

    async def check(self, conn: AsyncConnection[Any], *, due: bool = True, awaited: bool = False) -> bool:
        """Look for Redis data loss; start a recovery if found. Returns True when a loss was found.

        On one server, once this term's epoch is known and the written counter
        answers, the look at the streams runs in the background (:meth:`landed`):
        this call judges the look that finished since the last one, if any, and
        (``due``) starts the next. Its round trips and Redis's time then no longer
        hold back the publishing of jobs committed meanwhile. ``awaited``, a
        first look, the first check after a Redis error, a cluster's and one on a
        server refusing the counter's ``INCRBY`` look here, before returning.
        """
        if await self._judge_landed(conn):
            return True
        if not awaited and self._behind_allowed():
            if self._behind is None and (due or self._due_behind):
                self._due_behind = False
                self._behind = asyncio.create_task(self._look_behind(), name="stream-look")
            elif due:
                self._due_behind = True  # one is still under way: the next starts as soon as it is judged
            return False
        self.close()  # a look under way: this check looks itself
        self._awaited_next = False  # (a failure below sets it again: redis_failed)
        current = await self._epoch()
        if self._epoch_kept(current):
            if self.publisher.writes_lost:  # a batch's count came back short (relay/watermark.py, WriteCount)
                found_by = {"found_by": "the written counter"}
                log.warning("Redis lost the newest entries of streams (a failover?)", extra=found_by)
                await self._start_recovery(conn, "writes lost")
                return True
            return await self._judge(conn, current, await self._look(sliced=True))
        if current is not None and self.token is None and not current.startswith(RECOVERING):
            self.token = current  # a new term, and Redis kept its data: adopt the epoch
            # ...unless it lost the tail of a stream before this term (the leader died with it).
            await self._seed_marks(conn)
            lost = (await self._look()).lost
            if lost:
                log.warning("Redis lost the newest entries of streams (a failover?)", extra={"count": len(lost)})
                await self._start_recovery(conn, "stream tail lost")
                return True
            return False
        return await self._judge(conn, current, None)

    async def _judge(self, conn: AsyncConnection[Any], current: str | None, found: StreamReport | None) -> bool:
        """Start a recovery if the epoch key (``current``) or the look (``found``) says Redis lost data."""
        if self._epoch_kept(current):
            if found is None:
                return False
            if found.missing:
                log.warning("Redis lost streams the relay created", extra={"count": len(found.missing)})
                await self._start_recovery(conn, "missing streams")
                return True
            if found.lost:
                log.warning("Redis lost the newest entries of streams (a failover?)", extra={"count": len(found.lost)})
                await self._start_recovery(conn, "stream tail lost")
                return True
            return False
        reason = "epoch key missing" if current is None else "epoch changed or recovery unfinished"
        await self._start_recovery(conn, reason)
        return True

    async def _epoch(self) -> str | None:
        """The epoch key's value now (None: the key is gone)."""
        value = await self.redis.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    def _epoch_kept(self, current: str | None) -> bool:
        """Whether the epoch key's value (``current``) is this term's token (or its recovery's)."""
        return current is not None and self.token is not None and current in (self.token, RECOVERING + self.token)

    def _behind_allowed(self) -> bool:
        """A look may run beside the publishing: one server, this term's epoch known, and the written counter
        answering (it, not the look, finds a loss that the relay's own newer writes hide from the look)."""
        return (
            self._background
            and not self._awaited_next
            and self.token is not None
            and not self.publisher.writes_lost
            and self.publisher.written.counting
        )

    def redis_failed(self) -> None:
        """A command to Redis failed (or a batch was refused): the next check is made before anything
        is published, as Redis may come back without its data (a restart, a failover). A look under
        way, or one that failed, is dropped; one that finished with a report is still judged (its
        slice is not looked at again)."""
        self._awaited_next = True
        behind = self._behind
        if behind is not None and (not behind.done() or behind.cancelled() or behind.exception() is not None):
            self.close()  # (a look that failed too: its error is this one, and would only be raised again)

    def must_check(self) -> bool:
        """Whether the next turn must check before it publishes (after a Redis error or a refused batch)."""
        return self._awaited_next

    def landed(self) -> bool:
        """Whether a look started in the background has finished and waits for :meth:`check`."""
        return self._behind is not None and self._behind.done()

    async def _judge_landed(self, conn: AsyncConnection[Any]) -> bool:
        """Judge a look that finished beside the publishing, if one did (its Redis error is the caller's)."""
        behind = self._behind
        if behind is None or not behind.done():
            return False
        self._behind = None
        current, report = behind.result()
        return await self._judge(conn, current, report)

    async def _look_behind(self) -> tuple[str | None, StreamReport]:
        """The epoch key and the next slice of the streams, read beside the publishing.

        On one server only: a failover whose newest writes a look misses because
        the relay wrote to those streams first (their ids come from the clock, newer
        than the lost ones) is found by the written counter of that very write
        (relay/watermark.py, WriteCount). The calls go one at a time, so that Redis
        serves the relay's and the workers' commands between them. Wakes the
        publishing loop (``on_finding``) when there is something to act on.
        """
        try:
            if self.before_look is not None:
                await self.before_look()
            current = await self._epoch()
            found = await self._look(sliced=True, one_at_a_time=True)
        except Exception:
            if self.on_finding is not None:
                self.on_finding()
            raise
        if (
            not self._epoch_kept(current) or found.missing or found.lost or self._due_behind
        ) and self.on_finding is not None:
            self.on_finding()  # (or the next look fell due while this one ran)
        return current, found

    def close(self) -> None:
        """A recovery began, a check looks itself, or the term ended: a look still under way is cancelled
        (kept until it ends: :meth:`dropped_looks`), a finished one forgotten."""
        behind, self._behind = self._behind, None
        self._due_behind = False
        if behind is None:
            return
        if behind.done():
            if not behind.cancelled():
                behind.exception()  # retrieved: its error (Redis gone) was the term's, not news
            return
        behind.cancel()
        self._dropped.add(behind)
        behind.add_done_callback(self._dropped.discard)

    def dropped_looks(self) -> list[asyncio.Task[Any]]:
        """Looks cancelled and not yet ended (awaited at the term's end: each may be closing its connection)."""
        return list(self._dropped)

    async def _seed_marks(self, conn: AsyncConnection[Any]) -> None:
        """High-water marks from the entries PostgreSQL recorded for the newest in-flight rows."""
        cur = await conn.execute(sql.active().JOB_GET_RECENT_STREAM_IDS, {"limit": self.seed_rows})
        rows = await cur.fetchall()
        prefix = self.publisher.prefix
        self.publisher.high_water.record([stream_key(prefix, q, p) for q, p, _sid in rows], [r[2] for r in rows])

    def check_every(self, interval: float) -> float:
        """How often to check so that the slices look at every stream once per ``interval``."""
        return interval / max(1, math.ceil(self._streams / LOOK_SLICE))

    async def _look(self, *, sliced: bool = False, one_at_a_time: bool = False) -> StreamReport:
        """Which streams the relay created are gone, and which lost entries it wrote (relay/stream_check.py).

        ``sliced``: the next slice of the streams, after the one the previous look ended
        with (a check once per term looks at them all). ``one_at_a_time``: a queue's
        streams per round trip.
        """
        expected = self.publisher.high_water.snapshot()  # before asking: every mark in it was applied
        if sliced:
            found = await self.stream_check.look(
                self.publisher.known_groups,
                expected,
                after=self._look_after,
                limit=LOOK_SLICE,
                one_at_a_time=one_at_a_time,
            )
            self._look_after = found.resume_after
        else:
            found = await self.stream_check.look(self.publisher.known_groups, expected)
        self._streams = found.streams
        if found.refused and not self._xinfo_refused:
            # A server that refuses XINFO (an ACL, a managed Redis) cannot tell us about
            # lost tails; it must not stop publishing. The sweep still finds lost entries.
            self._xinfo_refused = True
            log.warning("XINFO refused: a lost stream tail is found by the sweep only")
        return found

    async def _start_recovery(self, conn: AsyncConnection[Any], reason: str) -> None:
        self.close()  # a look begun before the loss knows nothing the recovery does not redo
        first_check = self.token is None
        self.token = uuid.uuid4().hex
        await self.redis.set(self.key, RECOVERING + self.token)
        self.publisher.forget_groups()
        self.publisher.high_water.forget()
        self.publisher.forget_written()
        self.publisher.forget_held()  # their entries may be gone: sent again, not marked
        cur = await conn.execute(sql.active().DATABASE_NOW)
        row = await cur.fetchone()
        assert row is not None
        self.cutoff = row[0]
        self.cursor = 0
        self._recovered = 0
        if first_check:  # a fresh Redis looks like a lost one: republishing is harmless either way
            log.info("no epoch in Redis: republishing unfinished jobs, if any", extra={"reason": reason})
        else:
            log.warning("Redis lost data: republishing unfinished jobs", extra={"reason": reason})
        if self.on_loss is not None:
            self.on_loss()

    async def step(self, conn: AsyncConnection[Any]) -> list[int]:
        """Republish the next slice of a running recovery, as the rate allows."""
        if self.cutoff is None:
            return []
        allowed = self.limiter.take(self.batch_size)
        if allowed == 0:
            return []
        cur = await conn.execute(
            sql.active().JOB_GET_PUBLISHED_UNFINISHED, {"after": self.cursor, "cutoff": self.cutoff, "limit": allowed}
        )
        rows = await cur.fetchall()
        if not rows:
            self.limiter.tokens += allowed
            assert self.token is not None
            await self.redis.set(self.key, self.token, xx=True)  # a flush meanwhile leaves it missing: detected
            log.info("republish after Redis loss finished", extra={"count": self._recovered})
            self.cutoff = None
            return []
        self.limiter.tokens += allowed - len(rows)
        ids = await self._republish(conn, rows)
        self.cursor = rows[-1][0]
        self._recovered += len(ids)
        return ids

    async def sweep(self, conn: AsyncConnection[Any], *, force: bool = False) -> list[int]:
        """Republish in-flight rows whose stream entry no longer exists (a bounded slice per call)."""
        if self.recovering or (not force and self.clock() < self.next_sweep):
            return []
        self.next_sweep = self.clock() + self.sweep_interval
        try:
            return await self._sweep(conn)
        finally:
            self.sweeps += 1

    async def _sweep(self, conn: AsyncConnection[Any]) -> list[int]:
        cur = await conn.execute(
            sql.active().JOB_GET_INFLIGHT,
            {"after": self.sweep_cursor, "min_age": self.sweep_min_age, "limit": self.sweep_batch},
        )
        rows = await cur.fetchall()
        self.sweep_cursor = rows[-1][0] if len(rows) == self.sweep_batch else 0
        if not rows:
            return []
        named = [row for row in rows if row[8] is not None]  # a running row naming no entry: missing
        found: list[Any] = []
        if named:
            pipe = self.redis.pipeline(transaction=False)
            for row in named:
                pipe.xrange(self.publisher_key(row), min=row[8], max=row[8], count=1)
            found = await pipe.execute(raise_on_error=False)
        held = {row[0] for row, entries in zip(named, found, strict=True) if holds_job(entries, row[0])}
        missing = [row for row in rows if row[0] not in held]
        if not missing:
            return []
        if await self.check(conn, awaited=True):  # (the epoch key read now, not by a look beside)
            return []  # not a lost entry: Redis lost everything, and the recovery now covers these rows
        granted = self.limiter.take(len(missing))
        if granted < len(missing):
            missing = missing[:granted]
            self.sweep_cursor = missing[-1][0] if missing else rows[0][0] - 1
        if not missing:
            return []
        log.warning("stream entries missing: republishing", extra={"count": len(missing)})
        return await self._republish(conn, missing)

    def publisher_key(self, row: Row) -> str:
        return stream_key(self.publisher.prefix, row[1], row[5])

    async def _republish(self, conn: AsyncConnection[Any], rows: list[Row]) -> list[int]:
        # Re-read the state right before the XADD: a job that finished meanwhile is never published.
        cur = await conn.execute(sql.active().JOB_GET_STILL_UNFINISHED, {"ids": [row[0] for row in rows]})
        alive = {r[0] for r in await cur.fetchall()}
        rows = [row for row in rows if row[0] in alive]
        ids, sids, _refused = await self.publisher.xadd_rows(rows)
        if ids:
            cur = await conn.execute(
                sql.active().JOB_MARK_REPUBLISHED, {"ids": ids, "sids": sids, "term": self.publisher.term}
            )
            await check_term(cur, self.publisher.term)
            self.republished_total += len(ids)
            if self.on_republished is not None:
                self.on_republished(ids)
        return ids
