"""Publishing: due outbox rows → XADD to their (queue, priority) stream → mark published.

One batch is three round trips: one SELECT (due, unpublished, in id order), one
Redis write of the whole batch (an XADD per row, encoded by :mod:`postbox.resp`,
plus a best-effort ``published`` event per row while anyone subscribes to the
events channel), one UPDATE marking the whole batch with ``unnest`` arrays. The
SELECT and the UPDATE run on the leader's lock session (see :mod:`postbox.relay.leader`).
A backlog goes out in bursts: batch N+1 is sent to Redis while batch N is marked.

The relay's own loop may hold back the mark of a part batch (``mark_delay``,
``POSTBOX_RELAY_MARK_DELAY``): at moderate rates every job is a batch of its own,
and a worker usually claims it (which records ``published_at`` and the entry
itself) before the relay's mark arrives, so the mark mostly finds nothing left to
change. Held back, one mark covers every part batch of the delay and locks no row a
claim wants at that moment. Until it goes out, the held ids are left out of every
select (the rows are still unpublished in PostgreSQL); a relay that dies meanwhile
leaves them to be published again by the next leader, as a relay that dies between
its XADD and its mark always did.

XADD is never given MAXLEN: the relay never trims. Streams stay bounded because
workers XDEL an entry after its outcome is committed (only acknowledged entries
are ever deleted).

For benchmarks and tools, :func:`publish_once` publishes one batch and
:func:`drain` publishes until nothing is due, on any connection you pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from psycopg import AsyncConnection, AsyncCursor
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from postbox import events, pgarray, redis_conn, resp, sql, tracing
from postbox.audience import Audience
from postbox.relay.leader import LeadershipLost
from postbox.relay.watermark import HighWater, WriteCount
from postbox.streams import (
    GROUP,
    PRIORITIES,
    WAKE_MAXLEN,
    events_channel,
    ready_key,
    stream_key,
    wake_entry,
    wake_key,
    written_key,
)

log = logging.getLogger(__name__)

EVENTS_CHECK_INTERVAL = 1.0  # seconds between PUBSUB NUMSUB checks of the events channel
# Stream keys the publisher keeps between batches (text and bytes, by queue and priority): computed
# per row, they were a third of the relay's Python per row on one queue (docs/benchmarks.md,
# "twenty-third round"). Past this many the kept ones are dropped and the count starts again.
STREAM_NAMES_KEPT = 100_000
STATISTICS_CHECK_INTERVAL = 30.0  # seconds between checks of the planner's backlog estimate (full batches only)

# (id, queue, task, args, headers, priority, attempts, enq_ms, ...) as selected by sql.active().RELAY_SELECT_*
Row = tuple[Any, ...]
# Where a select of due rows starts (JOB_GET_DUE_UNPUBLISHED): (priority, id) of the last row already
# taken; FROM_THE_TOP is above every priority, so nothing is skipped.
Cursor = tuple[int, int]
FROM_THE_TOP: Cursor = (max(PRIORITIES) + 1, 0)


@dataclass
class BatchResult:
    """What one batch did."""

    selected: int = 0
    published: list[int] = field(default_factory=list)  # ids XADDed and marked (or claimed meanwhile)
    expired: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # XADD refused; retried next batch
    keyed: list[int] = field(default_factory=list)  # rows of fair queues, handed to their window (relay/fairness.py)
    marked: int = 0  # rows the UPDATE changed (a row a worker claimed first is not counted)


@dataclass
class _Held:
    """A part batch XADDed and not yet marked (see ``mark_delay``)."""

    result: BatchResult
    ids: list[int]
    sids: list[str]
    attempts: list[int]
    on_batch: Callable[[BatchResult], None] | None


async def check_term(cur: AsyncCursor[Any], term: int | None) -> int:
    """Rows a term-checked mark changed; raise :class:`LeadershipLost` if a newer term was recorded."""
    return term_checked(await cur.fetchone(), term)


def attempts_of(rows: Sequence[Row], ids: list[int]) -> list[int]:
    """Each sent id's ``attempts`` as selected: the mark leaves a row whose count moved since."""
    by_id = {row[0]: row[6] for row in rows}
    return [by_id[i] for i in ids]


def term_checked(row: Any, term: int | None) -> int:
    """The count of a term-checked mark's row (leads, count, ...); :class:`LeadershipLost` if it did not lead."""
    if row is None or not row[0]:
        raise LeadershipLost(f"a leader newer than term {term} is recorded: nothing marked")
    return int(row[1])


class Publisher:
    """XADDs rows to their streams; owns the set of streams whose group is known to exist."""

    def __init__(
        self,
        redis: redis_conn.AnyRedis,
        prefix: str,
        *,
        batch_size: int = 1000,
        emit_events: bool | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        before_mark: Callable[[list[int]], Awaitable[None]] | None = None,
        mark_delay: float = 0.0,
    ) -> None:
        self.redis = redis
        self.cluster = redis_conn.is_cluster(redis)  # a Redis Cluster: batches go per node (redis_conn.send_per_node)
        self.prefix = prefix
        self.batch_size = batch_size
        self.emit_events = emit_events  # None: only while someone subscribes (checked every second)
        self.monotonic = monotonic
        self.before_mark = before_mark  # test hook: runs between the XADDs and the mark
        # Fair queues (relay/fairness.py): takes a batch's rows of fair queues out of it
        # (they wait for their queue's window); None while no queue is fair.
        self.divert: Callable[[AsyncConnection[Any], list[Row]], Awaitable[list[int]]] | None = None
        self._statistics_checked = -1e9
        self.term: int | None = None  # the leader's term, checked by every mark (None: no lock, tools only)
        self.audience = Audience(redis, events_channel(prefix), interval=EVENTS_CHECK_INTERVAL, monotonic=monotonic)
        self.clock = clock
        self._recording = tracing.RecordingCheck(monotonic=monotonic)
        self.known_groups: set[str] = set()
        self._names: dict[tuple[str, int], tuple[str, bytes]] = {}  # stream keys (_stream_names)
        self._ready_key = ready_key(prefix).encode()
        self._wake_key = wake_key(prefix).encode()
        self.high_water = HighWater()  # newest entry id per stream, checked for a lost tail (relay/reconciler.py)
        # The written counter (one server): an answer lower than the last one plus the batch means
        # Redis lost writes (a failover to a replica that missed them); the reconciler acts on it.
        self._written_key = written_key(prefix).encode()
        self.written = WriteCount()
        self.writes_lost = False
        # When the next delayed row is due (a monotonic time; None: none waits), as the
        # current burst's last mark saw it; consumed by the next call of next_due().
        self._due_seen_by_mark: tuple[float | None] | None = None
        # Part batches whose mark is held back (publish_burst(hold=True)), their ids (left
        # out of every select until marked) and when the first of them was held.
        self.mark_delay = mark_delay
        self._held: list[_Held] = []
        self._held_ids: list[int] = []
        self._held_since = 0.0
        # The highest id a select returned or a notification's row carried in this term: a row
        # that came with its notification at or below it may have gone out already, and is left
        # to the select (publish_notified). None: nothing seen yet.
        self._seen_max: int | None = None
        self.notified_published = 0  # rows published from their notifications (tests, docs/relay.md)

    async def events_wanted(self) -> bool:
        """Whether to PUBLISH ``published`` events: always, never, or while the channel has subscribers."""
        if self.emit_events is not None:
            return self.emit_events
        return await self.audience.present()

    def forget_groups(self) -> None:
        """After Redis lost data: groups must be ensured again before the next XADD."""
        self.known_groups.clear()

    def forget_written(self) -> None:
        """After Redis lost data (a recovery starts): the next batch's count is the starting point."""
        self.written.forget()
        self.writes_lost = False

    async def ensure_groups(self, keys: Iterable[str]) -> None:
        """The consumer group on every stream of ``keys`` not known to have one: one round trip for all.

        (Key by key, a relay's first batches over 100 queues x 10 priorities waited for 1,000 round trips.)
        """
        new = sorted(set(keys) - self.known_groups)
        if not new:
            return
        refused: list[BaseException] = []
        for key, error in zip(new, await redis_conn.create_groups(self.redis, new, GROUP), strict=True):
            if error is None:
                self.known_groups.add(key)
            else:
                refused.append(error)
        if refused:
            raise refused[0]

    async def xadd_rows(self, rows: Sequence[Row]) -> tuple[list[int], list[str], list[int]]:
        """XADD each row, all in one write (see :mod:`postbox.resp`). Returns (ids added, entry ids, ids refused)."""
        if not rows:
            return [], [], []
        pairs = [(row[1], row[5]) for row in rows]
        streams = dict.fromkeys(pairs)  # the batch's (queue, priority) pairs, each once
        names = self._stream_names(streams)
        keys = [names[pair][0] for pair in pairs]
        keys_encoded = [names[pair][1] for pair in pairs]
        distinct = [names[pair] for pair in streams]  # (all taken before the first wait: names may be renewed)
        await self.ensure_groups(key for key, _encoded in distinct)
        emit = await self.events_wanted()
        now_ms = int(self.clock() * 1000)
        with tracing.publish_span(rows, recorded=self._recording()):
            chunks, routes = self._encode(rows, keys, keys_encoded, emit, now_ms)
            if self.cluster:  # each node's share in parallel, one reply per command as on one server
                results = await redis_conn.send_per_node(
                    cast(RedisCluster, self.redis), list(zip(routes, chunks, strict=True))
                )
            else:
                # Then the batch's streams into the ready set (jobs/streams.py), after their XADDs: a
                # read that runs between the two finds those streams in its walk of every stream.
                chunks.append(resp.command(b"SADD", self._ready_key, *(encoded for _key, encoded in distinct)))
                # Then the wake-up entry naming the batch's streams (jobs/streams.py, wake_key), after
                # the XADDs and the SADD: a worker woken by it finds both.
                chunks.append(resp.command(b"XADD", self._wake_key, b"MAXLEN", b"~", b"%d" % WAKE_MAXLEN, b"*",
                                           *wake_entry(streams)))  # fmt: skip
                # Last, the batch's count (relay/watermark.py, WriteCount): a replica that has it has the XADDs.
                chunks.append(resp.command(b"INCRBY", self._written_key, b"%d" % len(rows)))
                results = await resp.send_batch(cast(Redis, self.redis), b"".join(chunks), len(chunks))
                written = results.pop()
                if isinstance(woke := results.pop(), BaseException):
                    log.warning("XADD to the wake-up stream refused; workers over many queues wait longer: %s", woke)
                if isinstance(ready := results.pop(), BaseException):
                    log.warning("SADD to the ready set refused; workers find the entries within a second: %s", ready)
                if isinstance(written, int) and self.written.answered(len(rows), written):
                    self.writes_lost = True
        step = 2 if emit else 1
        ids: list[int] = []
        sids: list[str] = []
        refused: list[int] = []
        added: list[str] = []
        for row, key, result in zip(rows, keys, results[::step], strict=True):
            if isinstance(result, BaseException):
                refused.append(row[0])
                log.warning("XADD refused", extra={"outbox_id": row[0], "queue": row[1], "error": str(result)})
                continue
            ids.append(row[0])
            sids.append(result.decode() if isinstance(result, bytes) else str(result))
            added.append(key)
        self.high_water.record(added, sids)
        return ids, sids, refused

    def _stream_names(self, pairs: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[str, bytes]]:
        """The stream key of each (queue, priority), as text and bytes, kept from batch to batch."""
        names = self._names
        new = [pair for pair in pairs if pair not in names]
        if new:
            if len(names) >= STREAM_NAMES_KEPT:
                names.clear()
                new = list(pairs)
            for pair in new:
                key = stream_key(self.prefix, *pair)
                names[pair] = (key, key.encode())
        return names

    def _encode(
        self, rows: Sequence[Row], keys: list[str], keys_encoded: list[bytes], emit: bool, now_ms: int
    ) -> tuple[list[bytes], list[str]]:
        """The batch's commands pre-encoded (:mod:`postbox.resp`), and the key each is routed by on a cluster."""
        channel_name = events_channel(self.prefix)
        channel = channel_name.encode()
        chunks: list[bytes] = []
        routes: list[str] = []
        for row, key, key_encoded in zip(rows, keys, keys_encoded, strict=True):
            job_id, queue, task, args, headers, priority, attempts, enq_ms = row[:8]
            chunks.append(
                resp.xadd_entry(
                    key_encoded,
                    job_id=job_id,
                    task=task.encode(),
                    args=args.encode(),
                    headers=headers.encode(),
                    attempt=attempts + 1,
                    queue=queue.encode(),
                    priority=priority,
                    enqueued_ms=enq_ms,
                    published_ms=now_ms,
                )
            )
            routes.append(key)
            if emit:
                evt = events.event("published", job_id=job_id, queue=queue, task=task, attempt=attempts + 1)
                chunks.append(resp.publish(channel, events.encode(evt)))
                routes.append(channel_name)
        return chunks, routes

    async def select_due(
        self, conn: AsyncConnection[Any], *, after: Cursor = FROM_THE_TOP, limit: int | None = None
    ) -> list[Row]:
        """Due, unpublished rows, highest priority first, then in id order; ``after`` (the last row's
        priority and id) skips a batch still in flight (:meth:`publish_burst`)."""
        cur = await conn.execute(
            sql.active().JOB_GET_DUE_UNPUBLISHED,
            {
                "after_priority": after[0],
                "after_id": after[1],
                "limit": limit or self.batch_size,
                "held": pgarray.ints(self._held_ids),
            },
        )
        rows = await cur.fetchall()
        if rows:
            self._seen(max(row[0] for row in rows))
        if len(rows) >= self.batch_size:
            await self.check_statistics(conn)
        return rows

    def _seen(self, job_id: int) -> None:
        if self._seen_max is None or job_id > self._seen_max:
            self._seen_max = job_id

    async def publish_notified(
        self,
        conn: AsyncConnection[Any],
        rows: Sequence[Row],
        on_batch: Callable[[BatchResult], None] | None = None,
        *,
        hold: bool = False,
    ) -> tuple[BatchResult | None, bool]:
        """Publish rows that came with their notifications (relay/notifier.py), before any select.

        A row is sent only if no select of this term can have returned it (its id is above
        every id seen) and it is not held: anything else is left to a select, which finds a
        row still unpublished and skips one held or marked. ``hold`` as in :meth:`publish_burst`.
        Returns the batch's result (None: nothing was sent) and whether every row was dealt
        with here (sent, expired or handed to a fair queue): if not, the loop must select.
        """
        fresh: list[Row] = []
        for row in sorted(rows, key=lambda r: r[0]):
            if (self._seen_max is None or row[0] > self._seen_max) and row[0] not in self._held_ids:
                fresh.append(row)
                self._seen(row[0])
        if not fresh:
            return None, not rows
        result, live = await self._expire(conn, fresh)
        ids, sids, result.failed = await self.xadd_rows(live)
        self.notified_published += len(ids)
        attempts = attempts_of(live, ids)
        if hold and self.mark_delay > 0 and ids:
            self._hold(result, ids, sids, attempts, on_batch)
            if len(self._held_ids) >= self.batch_size:
                await self.flush_marks(conn)
        else:
            await self._mark(conn, result, ids, sids, attempts)
            if on_batch is not None:
                on_batch(result)
        return result, len(fresh) == len(rows) and not result.failed

    async def next_due(self, conn: AsyncConnection[Any]) -> float | None:
        """Seconds until the next delayed row is due (None: none waits).

        Right after a burst that marked rows, the answer the last mark brought
        back is used (once) instead of asking again: one round trip less per
        wake-up of a relay that publishes a few rows at a time.
        """
        seen, self._due_seen_by_mark = self._due_seen_by_mark, None
        if seen is not None:
            due_at = seen[0]
            return None if due_at is None else max(0.0, due_at - self.monotonic())
        cur = await conn.execute(sql.active().JOB_NEXT_DUE)
        row = await cur.fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))

    async def check_statistics(self, conn: AsyncConnection[Any]) -> bool:
        """After a full batch: ANALYZE the outbox if the planner believes fewer rows wait than we just read.

        Checked at most every ``STATISTICS_CHECK_INTERVAL`` seconds; returns True when it analyzed.
        """
        now = self.monotonic()
        if now - self._statistics_checked < STATISTICS_CHECK_INTERVAL:
            return False
        self._statistics_checked = now
        cur = await conn.execute(sql.active().JOB_ESTIMATE_UNPUBLISHED)
        row = await cur.fetchone()
        plan = row[0] if row else None
        estimate = float(plan[0]["Plan"]["Plan Rows"]) if plan else 0.0
        if estimate >= self.batch_size:
            return False
        log.info("outbox statistics are stale: analyzing", extra={"count": int(estimate)})
        await conn.execute(sql.active().JOB_ANALYZE)
        return True

    async def _expire(
        self, conn: AsyncConnection[Any], rows: list[Row], *, divert: bool = True
    ) -> tuple[BatchResult, list[Row]]:
        """Move rows past their ``expires_at`` to ``expired``; return the batch's result and the rows to send.

        Rows of fair queues are keyed and left to their queue's window (:attr:`divert`).
        """
        result = BatchResult(selected=len(rows))
        result.expired = [row[0] for row in rows if row[8]]
        if result.expired:
            await conn.execute(sql.active().JOB_MARK_EXPIRED, {"ids": result.expired})
            rows = [row for row in rows if not row[8]]
        if divert and self.divert is not None and rows:
            result.keyed = await self.divert(conn, rows)
            if result.keyed:
                keyed = set(result.keyed)
                rows = [row for row in rows if row[0] not in keyed]
        return result, rows

    async def publish_rows(self, conn: AsyncConnection[Any], rows: list[Row]) -> BatchResult:
        """Publish rows selected elsewhere (a fair queue's window, relay/fairness.py): expire, XADD, mark."""
        result, live = await self._expire(conn, rows, divert=False)
        if live:
            ids, sids, result.failed = await self.xadd_rows(live)
            await self._mark(conn, result, ids, sids, attempts_of(live, ids))
        return result

    async def _mark(
        self, conn: AsyncConnection[Any], result: BatchResult, ids: list[int], sids: list[str], attempts: list[int]
    ) -> None:
        if ids and self.before_mark is not None:
            await self.before_mark(ids)
        if ids:
            params = {
                "ids": pgarray.ints(ids),
                "sids": pgarray.words(sids),
                "term": self.term,
                "attempts": pgarray.ints(attempts),
            }
            cur = await conn.execute(sql.active().JOB_MARK_PUBLISHED, params)
            row = await cur.fetchone()
            result.marked = term_checked(row, self.term)
            assert row is not None
            self._due_seen_by_mark = (None if row[2] is None else self.monotonic() + max(0.0, float(row[2])),)
        result.published = ids

    async def publish_batch(self, conn: AsyncConnection[Any], limit: int | None = None) -> BatchResult:
        """Publish one batch of due rows on ``conn`` (the leader's session): select, XADD, mark."""
        rows = await self.select_due(conn, limit=limit)
        result, live = await self._expire(conn, rows)
        if live:
            ids, sids, result.failed = await self.xadd_rows(live)
            await self._mark(conn, result, ids, sids, attempts_of(live, ids))
        return result

    def marks_due_in(self) -> float | None:
        """Seconds until the held marks must go out (0: now); None while none is held."""
        if not self._held:
            return None
        return max(0.0, self._held_since + self.mark_delay - self.monotonic())

    async def flush_marks(self, conn: AsyncConnection[Any], *, due_only: bool = False) -> None:
        """Mark every held part batch in one statement (``due_only``: only once their delay is up).

        Raises :class:`LeadershipLost` as any mark does. The held list is emptied first:
        a mark that fails leaves the rows unpublished, to be selected and sent again.
        """
        due_in = self.marks_due_in()
        if due_in is None or (due_only and due_in > 0):
            return
        held, self._held, self._held_ids = self._held, [], []
        merged = BatchResult()
        await self._mark(
            conn,
            merged,
            [i for h in held for i in h.ids],
            [sid for h in held for sid in h.sids],
            [a for h in held for a in h.attempts],
        )
        held[-1].result.marked = merged.marked  # one count for the lot, on the last batch
        for h in held:
            if h.on_batch is not None:
                h.on_batch(h.result)

    def forget_held(self) -> None:
        """After Redis lost data: the held rows are selected and sent again rather than marked."""
        self._held, self._held_ids = [], []

    def _hold(
        self,
        result: BatchResult,
        ids: list[int],
        sids: list[str],
        attempts: list[int],
        on_batch: Callable[[BatchResult], None] | None,
    ) -> None:
        if not self._held:
            self._held_since = self.monotonic()
        self._held.append(_Held(result, ids, sids, attempts, on_batch))
        self._held_ids.extend(ids)
        result.published = ids

    async def publish_burst(
        self,
        conn: AsyncConnection[Any],
        max_batches: int = 8,
        keep_going: Callable[[], bool] | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
        *,
        hold: bool = False,
    ) -> list[BatchResult]:
        """Publish up to ``max_batches`` full batches back to back, marking one while sending the next.

        While PostgreSQL marks batch N, the relay already sends batch N+1 to Redis:
        batch N+1 is selected before N is marked, skipping N by its last row's priority
        and id (``after``). That skip lives only as long as the burst; every burst
        starts from the top again (the highest priority, the lowest unpublished id),
        so a late commit, or a job of a higher priority committed meanwhile, is never
        passed over for good.
        Stops after a batch that was not full, or when ``keep_going()`` turns false
        (a stopping relay finishes the batch in hand only). ``on_batch`` sees each batch
        once it is marked (even if a later batch of the burst fails). Returns one result per batch.

        ``hold``: the last batch, if not full, is left unmarked for up to ``mark_delay``
        (:meth:`flush_marks` marks it; ``on_batch`` sees it then); once a full batch's
        worth of ids is held, they are marked at once.
        """
        self._due_seen_by_mark = None  # only this burst's marks may answer next_due()
        rows = await self.select_due(conn)
        result, live = await self._expire(conn, rows)
        ids, sids, result.failed = await self.xadd_rows(live)
        attempts = attempts_of(live, ids)
        results: list[BatchResult] = []
        while True:
            results.append(result)
            more = len(rows) == self.batch_size and len(results) < max_batches and not result.failed
            more = more and (keep_going is None or keep_going())
            next_rows = await self.select_due(conn, after=cursor_after(rows)) if more else []
            if not next_rows and hold and self.mark_delay > 0 and ids:
                self._hold(result, ids, sids, attempts, on_batch)
                if len(self._held_ids) >= self.batch_size:  # a full batch's worth: no point waiting
                    await self.flush_marks(conn)
                return results
            next_result, next_live = await self._expire(conn, next_rows)
            marking = asyncio.ensure_future(self._mark(conn, result, ids, sids, attempts))
            try:
                if next_live:
                    ids, sids, next_result.failed = await self.xadd_rows(next_live)
                    attempts = attempts_of(next_live, ids)
                else:
                    ids, sids, attempts = [], [], []
            finally:
                await marking
                if on_batch is not None:  # reached only when the mark succeeded
                    on_batch(result)
            if not next_rows:
                return results
            rows, result = next_rows, next_result


def cursor_after(rows: Sequence[Row]) -> Cursor:
    """The cursor past ``rows`` (in the select's order: the last one is where the next select starts)."""
    last = rows[-1]
    return (int(last[5]), int(last[0]))


async def publish_once(
    conn: AsyncConnection[Any],
    redis: redis_conn.AnyRedis,
    prefix: str,
    *,
    batch_size: int = 1000,
    emit_events: bool | None = None,
) -> BatchResult:
    """Publish one batch of due rows with a throwaway :class:`Publisher` (tools, benchmarks).

    ``conn`` must be an autocommit connection. This does not take the leader
    lock: use it only where no relay runs, or on the leader's own session.
    """
    return await Publisher(redis, prefix, batch_size=batch_size, emit_events=emit_events).publish_batch(conn)


async def drain(
    conn: AsyncConnection[Any],
    redis: redis_conn.AnyRedis,
    prefix: str,
    *,
    batch_size: int = 1000,
    emit_events: bool | None = None,
) -> int:
    """Publish batches until no row is due; return how many rows were published."""
    publisher = Publisher(redis, prefix, batch_size=batch_size, emit_events=emit_events)
    total = 0
    while True:
        results = await publisher.publish_burst(conn)
        total += sum(len(result.published) for result in results)
        last = results[-1]
        if last.selected < batch_size and not last.failed:
            return total
        if last.selected and not last.published and not last.expired:
            raise RedisError(f"every XADD of a batch of {last.selected} was refused")
