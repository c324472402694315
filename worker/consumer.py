"""Read stream entries for this worker: strict priority, never more than free capacity.

One Lua script reads the worker's streams highest priority first
(XREADGROUP ``>`` on each stream holding entries, stopping once ``count``
entries are in hand; an empty stream costs one XLEN), so an available
higher-priority entry always comes before a lower one and nothing beyond free
capacity is taken. When the streams are drained the script also
returns each stream's newest entry id; the consumer then blocks on a plain
XREAD after those ids, a wake-up that consumes nothing from the group. The
wake-up names the streams that answered, and the worker's next read looks at
those only (over 100 queues x 10 priorities a read of every stream cost about
2 ms of Redis and a wake-up's XREAD another 1.7 ms of worker CPU, per job at
low rates); an entry added to another stream meanwhile is newer than that
stream's tail, so the next wait answers at once and nothing is missed. The
wait blocks per group of :data:`WAIT_GROUP` streams, and the groups that did
not answer stay blocked into the next wait: Redis re-registers one group's
keys per wake-up, not every stream's.

On one server, over at most :data:`WAIT_GROUP` streams, the wake-up and the read
after it go out together (:meth:`Consumer.wait_then_read`): the blocked XREAD
and then the read script, in one send on the consumer's own connection. Redis
keeps a blocked client's next command in its buffer and runs it as soon as the
XREAD answers, so the entries come back with the wake-up instead of one round
trip after it. The read's count is fixed when the wait starts (the worker's free
capacity then). :meth:`Consumer.interrupt_wait` ends such a wait early with
``CLIENT UNBLOCK`` (the worker stops, or a queue was paused): the XREAD answers
as at its timeout and the read behind it runs at once, so nothing the read
takes is lost with a dropped connection.

Over more than :data:`WAIT_GROUP` streams on one server the wait is on one key
instead, the wake-up stream the relay writes after each batch
(:func:`postbox.streams.wake_key`): the drained read of every stream takes
its cursor in the same script run, and the wake-up read script, sent behind
the blocked XREAD, takes the entries after it and reads the streams they name.
A consumer that finds entries no wake-up entry announced, after two timeouts
in a row (a relay of an earlier version), waits on the streams, in groups, for
:data:`WAKE_OFF` seconds (docs/worker.md, "Reading"); one whose cursor the
stream was trimmed past reads every stream.

A group that vanished (Redis lost its data) is recreated from ``0`` once its
stream holds an entry again (a read of an empty stream never asks for it).

On a Redis Cluster a worker's queues live in different slots (one slot per
queue, the ``{queue}`` hash tag), and a script may only touch one slot: the
script runs once per queue, in the worker's queue order, each read asking for
what the previous ones left of ``count``. Strict priority holds within each
queue; across queues the earlier queue in the worker's list comes first (on one
server a higher priority of any queue comes first). The wake-up is one blocking
XREAD per queue, in parallel, ended as soon as one of them sees an entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from postbox import redis_conn, resp
from postbox.streams import GROUP, WAKE_MAXLEN, by_slot, parse_stream_key, parse_wake, wake_key
from postbox.worker.delivery import Delivery, parse_entry
from postbox.worker.wake import WakeCursor

log = logging.getLogger(__name__)

# What a read returns: deliveries in priority order, malformed (stream, id) pairs, and the
# streams' tails when it drained them (empty when it reached its count).
Read = tuple[list[Delivery], list[tuple[str, bytes]], dict[str, str]]

# Both read scripts read a stream through this (ARGV[1], ARGV[2]: group, consumer). A missing
# group (Redis lost data; a deleted stream made again by a relay's XADD) is made again from the
# start, as ensure_groups() does, and the stream read in the same run: an error would end the run
# with what it already took from earlier streams delivered to this consumer and returned to nobody
# (Redis keeps what a script did before an error) until the visibility timeout.
READ_GROUP = """
local function read_group(key, count)
    local got = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', key, '>')
    if type(got) == 'table' and got.err then
        if not string.find(got.err, 'NOGROUP', 1, true) then error(got) end
        redis.call('XGROUP', 'CREATE', key, ARGV[1], '0')
        got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', key, '>')
    end
    return got
end
"""

# KEYS: streams, highest priority first, then (when ARGV[4] is "1") the ready set,
# then (when ARGV[5] is "1") the wake-up stream.
# ARGV: group, consumer, count, whether there is the ready set, whether there is the wake-up stream,
# whether to put back into the set every stream holding entries outside it first.
# Returns {{stream, entries}...}, 1 when fewer than count were found (0 when the
# count was reached), and then the newest entry id of each stream holding any,
# as {index, id, ...} (the others are empty: '0-0' for the wake-up XREAD); with
# the wake-up stream and fewer than count found, a fourth item: its newest entry
# id ('0-0' when it has none), taken in the same atomic run as the walk that
# found every stream drained.
#
# XREADGROUP and XREVRANGE go only to streams holding entries. Entries are
# deleted as their jobs end (XACK + XDEL), so below saturation most of a
# worker's streams are empty, and an XLEN costs Redis a fraction of the two
# commands it saves: an empty read over 1,000 streams, 22.5 -> 2.2 ms of Redis
# time; over a backlog (20 entries in each), 2.0 -> 1.3 ms.
#
# With the ready set (one server; streams.ready_key), a read that can fill its
# count looks only at the streams in the set: the relay adds a stream to it with
# every XADD, and this script takes out a stream it finds empty. A stream
# outside the set therefore holds only entries never delivered (it was empty when
# it left, and no read delivers from it while it is out). Over 100 queues x 10
# priorities under a backlog, the XLEN of every stream before the one holding the
# next entries was 100,000 XLENs per 10,000 jobs (docs/benchmarks.md, issue 30).
# A read that drains the set walks every stream as before: a non-empty stream
# outside the set (its XADD's SADD not run yet, an older relay, a lost set) goes
# into it and is read in that walk, so nothing waits on the set; the walk also
# gives the tails for the wake-up. A read that keeps filling its count makes no
# such walk, so once a second (ARGV[6], READY_CHECK_EVERY) a read of every
# stream first puts back any stream holding entries outside the set: one whose
# SADD was refused, an older relay's, a set lost in a failover would otherwise
# wait behind the whole backlog of the set's streams, whatever its priority.
_READ = """
local want = tonumber(ARGV[3])
local n = #KEYS
local wake = nil
if ARGV[5] == '1' then
    wake = KEYS[n]
    n = n - 1
end
local set = nil
if ARGV[4] == '1' then
    set = KEYS[n]
    n = n - 1
end
local found = {}
local order = {}  -- found's stream indexes, kept in step when the walk below reads a stream out of turn
local function take(i, key)
    local got = read_group(key, want)
    if got then
        local entries = got[1][2]
        want = want - #entries
        found[#found + 1] = {key, entries}
        order[#order + 1] = i
        return true
    end
    return false
end
local held = {}  -- the streams holding entries, all of them once a walk of every stream ends with want > 0
if set then
    if ARGV[6] == '1' then
        for first = 1, n, 1000 do  -- (unpack's limit is some 8,000 values)
            local last = math.min(n, first + 999)
            local member = redis.call('SMISMEMBER', set, unpack(KEYS, first, last))
            for i = first, last do
                if member[i - first + 1] == 0 and redis.call('XLEN', KEYS[i]) > 0 then
                    redis.call('SADD', set, KEYS[i])
                end
            end
        end
    end
    -- The set's members among the next 64 streams at a time: a read that fills its count
    -- near the top asks about a few streams, not all of them.
    local gone = {}
    local first = 1
    while first <= n and want > 0 do
        local last = math.min(n, first + 63)
        local member = redis.call('SMISMEMBER', set, unpack(KEYS, first, last))
        for i = first, last do
            if want <= 0 then break end
            local key = KEYS[i]
            if member[i - first + 1] == 1 then
                if redis.call('XLEN', key) == 0 then  -- (a deleted stream too: never read without its group)
                    gone[#gone + 1] = key
                else
                    take(i, key)
                end
            end
        end
        first = last + 1
    end
    for k = 1, #gone, 1000 do redis.call('SREM', set, unpack(gone, k, math.min(#gone, k + 999))) end
    if want <= 0 then return {found, 0, {}} end
    local read = #found
    for first = 1, n, 1000 do  -- (unpack's limit is some 8,000 values)
        local last = math.min(n, first + 999)
        local member = redis.call('SMISMEMBER', set, unpack(KEYS, first, last))
        for i = first, last do
            local key = KEYS[i]
            if redis.call('XLEN', key) > 0 then
                held[#held + 1] = i
                if member[i - first + 1] == 0 then
                    redis.call('SADD', set, key)
                    if want > 0 then take(i, key) end
                end
            end
        end
    end
    if #found > read and read > 0 then  -- back into priority order
        local at = {}
        for k, i in ipairs(order) do at[i] = found[k] end
        table.sort(order)
        for k, i in ipairs(order) do found[k] = at[i] end
    end
else
    for i = 1, n do
        if want <= 0 then break end
        local key = KEYS[i]
        if redis.call('XLEN', key) > 0 then
            held[#held + 1] = i
            take(i, key)
        end
    end
end
if want <= 0 then return {found, 0, {}} end
local tails = {}
for _, i in ipairs(held) do
    local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
    if #last > 0 then
        tails[#tails + 1] = i
        tails[#tails + 1] = last[1][1]
    end
end
if wake then
    local last = redis.call('XREVRANGE', wake, '+', '-', 'COUNT', 1)
    return {found, 1, tails, #last > 0 and last[1][1] or '0-0'}
end
return {found, 1, tails}
"""
READ_SCRIPT = READ_GROUP + _READ

EMPTY_TAIL = "0-0"

# The read that rides with a wake-up on the wake-up stream (one server, a worker of more than
# WAIT_GROUP streams: Consumer.wait_then_read), run right after that XREAD, in the same send.
# KEYS: the wake-up stream. ARGV: group, consumer, the stream prefix, how many wake-up entries
# to take at most, the worker's queues in its order, then count and the cursor.
# Takes the wake-up entries after the cursor and reads the streams they name among the worker's
# queues, highest priority first (then in the worker's queue order), up to count entries.
# Returns {{stream, entries}...}, 1 when fewer than count were found (0 when the count was
# reached, or when the cursor's own entry is gone), and the last wake-up entry id taken ('' when
# there was none after the cursor). The cursor's entry is gone when the stream was trimmed past
# it (MAXLEN ~ keeps about WAKE_MAXLEN entries of every queue's batches: a worker that did not
# wait for a while, its capacity full, can come back to a cursor older than all of them) or lost
# with Redis's data: entries after it may be gone too, and the streams they named unread, so the
# read of every stream follows, as after a read that reached its count. A cursor of 0-0 (the
# stream was empty when it was taken) counts as gone once the stream has grown to its bound.
# The streams' keys are built here from the entries, not declared in KEYS: Redis allows that
# on one server (a cluster never runs this script), and a worker of 1,000 streams would
# otherwise name them all in each call (about 100 us of Redis, docs/benchmarks.md).
_WAKE_READ = """
local n = #ARGV
local want = tonumber(ARGV[n - 1])
local got = redis.call('XRANGE', KEYS[1], '(' .. ARGV[n], '+', 'COUNT', ARGV[4])
if #got == 0 then return {{}, 1, ''} end
local intact
if ARGV[n] == '0-0' then  -- (the stream was empty then: nothing trimmed since unless it grew to its bound)
    intact = redis.call('XLEN', KEYS[1]) < WAKE_MAXLEN
else
    intact = #redis.call('XRANGE', KEYS[1], ARGV[n], ARGV[n]) > 0
end
local rank = {}
for i = 5, n - 2 do rank[ARGV[i]] = i end
local named, seen = {}, {}
for _, entry in ipairs(got) do
    local fields = entry[2]
    for j = 1, #fields - 1, 2 do
        local queue = fields[j]
        local r = rank[queue]
        if r then
            local digits = fields[j + 1]
            for k = 1, #digits do
                local p = string.byte(digits, k) - 48
                if p >= 0 and p <= 9 then
                    local key = ARGV[3] .. ':{' .. queue .. '}:p' .. p
                    if not seen[key] then
                        seen[key] = true
                        named[#named + 1] = {p, r, key}
                    end
                end
            end
        end
    end
end
table.sort(named, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] < b[2]
end)
local found = {}
for _, stream in ipairs(named) do
    if want <= 0 then break end
    if redis.call('XLEN', stream[3]) > 0 then  -- (a deleted stream: never read without its group)
        local r = read_group(stream[3], want)
        if r then
            want = want - #r[1][2]
            found[#found + 1] = {stream[3], r[1][2]}
        end
    end
end
return {found, (want > 0 and intact) and 1 or 0, got[#got][1]}
"""
WAKE_READ_SCRIPT = READ_GROUP + _WAKE_READ.replace("WAKE_MAXLEN", str(WAKE_MAXLEN))

# Streams per blocked wake-up XREAD. Redis registers a blocked XREAD on each of
# its keys and unregisters it from all of them when one answers: over 1,000
# streams in one XREAD that was about 370 us of Redis CPU per job at 200 jobs/s
# (docs/benchmarks.md, issue 30). In groups, the groups that did not answer stay
# blocked (their older tails still catch every newer entry) and only the one
# that answered is registered again.
WAIT_GROUP = 100

# Seconds between the ready set's checks by a worker whose reads keep filling their count (READ_SCRIPT).
READY_CHECK_EVERY = 1.0

# Entries one wake-up XREAD takes from the wake-up stream (more wait for the next one, at once).
WAKE_COUNT = 100
# Seconds a consumer waits on the streams themselves after it found entries that came with no
# wake-up entry (a relay of an earlier version leads): then it tries the wake-up stream again.
WAKE_OFF = 300.0


def is_nogroup(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


async def ensure_groups(redis: redis_conn.AnyRedis, streams: Sequence[str]) -> None:
    """Create the consumer group on every stream (from 0, MKSTREAM); BUSYGROUP is fine. Raises the first refusal."""
    for error in await redis_conn.create_groups(redis, streams, GROUP):
        if error is not None:
            raise error


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Consumer:
    def __init__(
        self,
        redis: redis_conn.AnyRedis,
        *,
        consumer: str,
        ready: str | None = None,
        wake_prefix: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``ready``: the ready set's key (:func:`postbox.streams.ready_key`), kept by the relay on one
        server; reads then look only at the streams in it while they fill their count. None (and on a
        cluster, where a script may not span queues): every stream is looked at.

        ``wake_prefix``: the stream prefix whose wake-up stream (:func:`postbox.streams.wake_key`) a
        wait over more than :data:`WAIT_GROUP` streams blocks on, on one server (see :meth:`wait_for_new`).
        None: such a wait blocks on the streams, in groups."""
        self._redis = redis
        self._cluster = redis_conn.is_cluster(redis)
        self._ready = None if self._cluster or ready is None else ready.encode()
        self._wake_prefix = None if self._cluster else wake_prefix
        self._wake = None if self._wake_prefix is None else wake_key(self._wake_prefix).encode()
        self._cursor = WakeCursor(off_for=WAKE_OFF, monotonic=monotonic)  # on the wake-up stream
        self._monotonic = monotonic
        self._set_checked_at = -float("inf")  # the last read that walked every stream (READY_CHECK_EVERY)
        self._wake_wait: tuple[str, asyncio.Future[tuple[str | None, set[str]]]] | None = None
        self._wake_script = redis.register_script(WAKE_READ_SCRIPT)
        self._wake_head: tuple[Sequence[str], tuple[int, bytes]] | None = None  # (streams, packed head)
        self._script = redis.register_script(READ_SCRIPT)
        self._group_and_consumer = (GROUP.encode(), consumer.encode())
        self._keys: dict[str, bytes] = {}
        self._read_for: tuple[Sequence[str], bool] | None = None  # the streams (a list not modified) and
        # whether the wake-up stream is named too: what _read_head names
        self._read_head: tuple[int, bytes] = (0, b"")
        # Wake-up reads still blocked, by their group of streams (wait_for_new): they outlive the call
        # that started them, so a wake-up re-registers only the group that answered.
        self._blocked: dict[tuple[str, ...], asyncio.Future[set[str]]] = {}
        # wait_then_read's own connection (held between waits), and its client id while a wait is blocked
        self._wait_conn: Connection | None = None
        self._wait_client: int | None = None
        self._waiting: int | None = None
        self._no_unblock = False  # CLIENT ID, CLIENT UNBLOCK or the wait's XREAD refused (an ACL): wait and read apart

    async def _run_script(self, streams: Sequence[str], count: int, wake: bool = False, check: bool = False) -> Any:
        """EVALSHA of the read script, encoded and sent as one raw command (jobs/resp.py).

        redis-py's Script call packs the command generically and reads the
        reply under its own timeout; this runs once per read, so once per
        claimed batch. A server without the script (restarted, flushed) gets it
        loaded and the call repeated.
        """
        if self._cluster:
            return await self._run_script_per_queue(streams, count)
        payload = self._read_command(streams, count, wake, check)
        for attempt in (1, 2):
            [reply] = await resp.send_batch(cast(Redis, self._redis), payload, 1)  # one server here
            if not isinstance(reply, ResponseError):
                return reply
            if attempt == 1 and isinstance(reply, NoScriptError):
                await self._redis.script_load(READ_SCRIPT)
                continue
            raise reply

    def _read_command(self, streams: Sequence[str], count: int, wake: bool = False, check: bool = False) -> bytes:
        """The read script's EVALSHA over ``streams`` for ``count`` entries, RESP-encoded.

        ``wake``: the wake-up stream is named too, and a drained read returns its newest entry id.
        ``check``: first put back into the ready set every stream holding entries outside it."""
        read_for = self._read_for
        if read_for is None or read_for[0] is not streams or read_for[1] != wake:
            # packed once per list of streams (a read of every stream names 1,000)
            keys = [self._key(key) for key in streams]
            if self._ready is not None:
                keys.append(self._ready)
            if wake:
                assert self._wake is not None
                keys.append(self._wake)
            self._read_head = resp.command_head(
                b"EVALSHA", self._script.sha.encode(), b"%d" % len(keys), *keys, *self._group_and_consumer
            )
            self._read_for = (streams, wake)
        return resp.with_tail(
            self._read_head,
            b"%d" % count,
            b"0" if self._ready is None else b"1",
            b"1" if wake else b"0",
            b"1" if check else b"0",
        )

    def _set_check_due(self) -> bool:
        """Whether a read of every stream should check the ready set now (then it counts as checked)."""
        if self._ready is None:
            return False
        now = self._monotonic()
        if now - self._set_checked_at < READY_CHECK_EVERY:
            return False
        self._set_checked_at = now
        return True

    def _walked(self, tails: dict[str, str]) -> None:
        """A read of every stream drained them: its walk put back what the set lacked."""
        if tails:
            self._set_checked_at = self._monotonic()

    async def _run_script_per_queue(self, streams: Sequence[str], count: int) -> Any:
        """A cluster: the script once per queue (one slot each), merged into one reply of the same shape."""
        found: list[Any] = []
        tails: list[Any] = []
        want = count
        position = {key: index for index, key in enumerate(streams, start=1)}  # the tails' indexes
        for group in by_slot(streams):
            if want <= 0:
                break
            args: list[bytes | int] = [*self._group_and_consumer, want]
            try:
                part_found, _drained, part_tails = await redis_conn.run_script(self._script, group, args)
            except ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                log.warning("consumer group missing (Redis lost data?); recreating it from 0")
                await ensure_groups(self._redis, group)  # this queue's only: the others' entries are in hand
                part_found, _drained, part_tails = await redis_conn.run_script(self._script, group, args)
            for _stream, entries in part_found:
                want -= len(entries)
            found.extend(part_found)
            for index, tail in zip(part_tails[::2], part_tails[1::2], strict=True):
                tails += [position[group[int(index) - 1]], tail]
        if want > 0:  # every queue drained: the tails of all of them, as one server reports them
            return [found, 1, tails]
        return [found, 0, []]

    async def read(self, streams: Sequence[str], count: int, *, whole: bool = False) -> Read:
        """Up to ``count`` new entries in priority order, malformed (stream, id) pairs, and tails.

        Tails are empty when ``count`` entries were found (more may be waiting);
        otherwise every stream's newest entry id (``0-0`` for an empty stream).
        ``whole``: ``streams`` are every stream the next waits cover (the same
        list, not modified), not the few a wake-up named; a drained read of them
        takes the wake-up stream's cursor (:meth:`wait_for_new`).
        """
        wake = whole and self._wake_wanted(streams)
        check = whole and self._set_check_due()
        try:
            reply: Any = await self._run_script(streams, count, wake, check)
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
            log.warning("consumer group missing (Redis lost data?); recreating it from 0")
            await ensure_groups(self._redis, streams)
            reply = await self._run_script(streams, count, wake, check)
        read = self._parse(reply, streams)
        if whole:
            self._whole_read(streams, reply, len(read[0]), wake)
            self._walked(read[2])
        return read

    def _wake_wanted(self, streams: Sequence[str]) -> bool:
        return self._wake is not None and len(streams) > WAIT_GROUP and self._cursor.on()

    def _wake_cursor(self, streams: Sequence[str]) -> str | None:
        """The cursor a wait over ``streams`` blocks on the wake-up stream after (None: wait on the streams)."""
        return self._cursor.cursor_for(streams) if self._wake_wanted(streams) else None

    def _whole_read(self, streams: Sequence[str], reply: Any, found: int, wake: bool) -> None:
        """After a read of every stream: the wake-up stream's cursor, and the check for missed wake-ups."""
        drained = bool(int(reply[1]))
        tail = _text(reply[3]) if wake and drained and len(reply) > 3 else None
        if self._cursor.read_every_stream(streams, found, drained, tail):
            log.warning(
                "entries came with no wake-up entry (a relay of an earlier version?): "
                "waiting on the streams themselves for %.0f s",
                WAKE_OFF,
            )

    def reads_on_wake(self, streams: Sequence[str]) -> bool:
        """Whether :meth:`wait_then_read` serves ``streams``: one server, one wait group or the wake-up
        stream, no wait blocked."""
        if self._cluster or self._blocked or self._wake_wait is not None or self._no_unblock:
            return False
        return len(streams) <= WAIT_GROUP or self._wake_cursor(streams) is not None

    async def wait_then_read(self, tails: dict[str, str], streams: Sequence[str], count: int, block: float) -> Read:
        """Block until an entry newer than ``tails`` arrives (or ``block`` seconds pass), then read as :meth:`read`.

        One send: ``XREAD BLOCK`` over ``tails``' streams, then the read script over
        ``streams`` for ``count`` entries, which Redis runs as soon as the XREAD
        answers. At the timeout the read runs too (it finds nothing new, and
        reports the tails again). For one server and at most :data:`WAIT_GROUP`
        streams (:meth:`reads_on_wake`).

        Over more streams, once a drained read of every stream took the wake-up
        stream's cursor: ``XREAD BLOCK`` on the wake-up stream after the cursor,
        then the wake-up read script, which takes the wake-up entries and reads
        the streams they name (among this worker's queues). Its tails are
        ``tails`` itself when it drained them (wait again), and empty when it
        reached its count or found no wake-up entry (the wait timed out or was
        ended: read every stream next). Cancelling the call drops the connection:
        entries its read took then stay pending until they are reclaimed, so
        end a wait with :meth:`interrupt_wait` rather than a cancellation.
        """
        conn = await self._own_connection()
        if conn is None:  # no CLIENT ID here: nothing waited, nothing read; the caller waits apart from now on
            return [], [], dict(tails)
        cursor = self._wake_cursor(streams)
        if cursor is not None:
            assert self._wake is not None
            payload = resp.command(
                b"XREAD", b"COUNT", b"1", b"BLOCK", b"%d" % max(1, int(block * 1000)), b"STREAMS",
                self._wake, cursor.encode(),
            ) + self._wake_read_command(streams, count, cursor)  # fmt: skip
        else:
            waited = list(tails)
            payload = resp.command(
                b"XREAD", b"COUNT", b"1", b"BLOCK", b"%d" % max(1, int(block * 1000)), b"STREAMS",
                *(self._key(stream) for stream in waited), *(tails[stream].encode() for stream in waited),
            ) + self._read_command(streams, count, check=self._set_check_due())  # fmt: skip
        self._waiting = self._wait_client
        try:
            [woke, reply] = await resp.exchange(conn, payload, 2, blocks=block)
        finally:
            self._waiting = None
        if isinstance(woke, ResponseError):
            # The read behind it ran all the same, at once: waiting this way again would spin. From now
            # on the wait is sent apart (wait_for_new), where a refusal is an error the caller backs off on.
            log.warning("the wait's XREAD was refused (%s): this worker waits for entries and then reads them", woke)
            self._no_unblock = True
        if cursor is not None and isinstance(reply, NoScriptError):  # loaded, and run again alone: nothing else changes
            await self._redis.script_load(WAKE_READ_SCRIPT)
            [reply] = await resp.exchange(conn, self._wake_read_command(streams, count, cursor), 1)
        if isinstance(reply, NoScriptError) or (isinstance(reply, ResponseError) and is_nogroup(reply)):
            if isinstance(reply, NoScriptError):
                await self._redis.script_load(READ_SCRIPT)
            return await self.read(streams, count, whole=True)  # recreates a lost group
        if isinstance(reply, ResponseError):
            raise reply
        if cursor is not None:
            return self._woken_read(reply, streams, tails)
        read = self._parse(reply, streams)
        self._walked(read[2])
        return read

    def _wake_read_command(self, streams: Sequence[str], count: int, cursor: str) -> bytes:
        """The wake-up read script's EVALSHA for this worker's ``streams``, RESP-encoded."""
        if self._wake_head is None or self._wake_head[0] is not streams:  # packed once per list of streams
            assert self._wake is not None and self._wake_prefix is not None
            queues = dict.fromkeys(parse_stream_key(self._wake_prefix, key)[0] for key in streams)
            head = resp.command_head(
                b"EVALSHA", self._wake_script.sha.encode(), b"1", self._wake, *self._group_and_consumer,
                self._wake_prefix.encode(), b"%d" % WAKE_COUNT, *(queue.encode() for queue in queues),
            )  # fmt: skip
            self._wake_head = (streams, head)
        return resp.with_tail(self._wake_head[1], b"%d" % count, cursor.encode())

    def _woken_read(self, reply: Any, streams: Sequence[str], tails: dict[str, str]) -> Read:
        """The wake-up read script's reply: what it read, and ``tails`` when it drained what it was woken for."""
        found, drained, last = reply
        deliveries, malformed, _ = self._parse([found, 0, []], streams)
        last = _text(last)
        if not last:  # no wake-up entry after the cursor: the wait timed out, or was ended
            self._cursor.timed_out()
            return deliveries, malformed, {}
        self._cursor.woke(last)
        return deliveries, malformed, dict(tails) if int(drained) else {}

    async def wait_then_read_until(
        self,
        tails: dict[str, str],
        streams: Sequence[str],
        count: int,
        block: float,
        stop: asyncio.Future[Any],
        grace: float,
    ) -> Read:
        """:meth:`wait_then_read` in the calling task, ended by ``stop`` as by :meth:`interrupt_wait`.

        No task runs the wait: the entries are in the caller's hands on the
        wake-up's own turn of the loop (a task and a wait around it cost two
        more turns per wake-up). Once ``stop`` is done, a helper sends ``CLIENT
        UNBLOCK`` (again while an UNBLOCK found no wait blocked yet) until the
        read answers; if it has not after ``grace`` seconds, the wait is
        dropped with its connection and nothing is returned (what its read took
        stays pending until it is reclaimed).
        """
        ender = _WaitEnder(self, grace)
        stop.add_done_callback(ender.start)
        try:
            async with asyncio.timeout(None) as ender.deadline:
                return await self.wait_then_read(tails, streams, count, block)
        except TimeoutError:
            if ender.deadline is None or not ender.deadline.expired():
                raise
            return [], [], {}
        finally:
            ender.finished = True
            stop.remove_done_callback(ender.start)
            if ender.task is not None:
                ender.task.cancel()
                await asyncio.gather(ender.task, return_exceptions=True)

    async def interrupt_wait(self) -> None:
        """End a :meth:`wait_then_read` wait now, as at its timeout: its read runs and answers at once."""
        client = self._waiting
        if client is not None:
            await self._redis.execute_command("CLIENT", "UNBLOCK", client)

    async def _own_connection(self) -> Connection | None:
        """This consumer's connection for :meth:`wait_then_read` (its client id known, for ``CLIENT UNBLOCK``).

        A connection that was dropped (a failed or cancelled exchange) is opened
        again, and its new id asked for. None when the server refuses ``CLIENT
        ID`` or ``CLIENT UNBLOCK`` (an ACL without them): a wait this consumer
        could not end without dropping its read is not made, and
        :meth:`reads_on_wake` answers False from then on.
        """
        conn = self._wait_conn
        if conn is None:
            conn = self._wait_conn = await resp.take_connection(cast(Redis, self._redis))
            self._wait_client = None
        elif conn.is_connected:
            # As the pool checks a connection it hands out: one closed by the server
            # meanwhile (killed, a timeout, a restart) reads as readable. Opened again.
            try:
                stale = await conn.can_read()
            except (RedisConnectionError, OSError):
                stale = True
            if stale:
                await conn.disconnect()
        if self._wait_client is None or not conn.is_connected:
            self._wait_client = None
            await conn.connect()
            [client] = await resp.exchange(conn, resp.command(b"CLIENT", b"ID"), 1)
            refused = client if isinstance(client, ResponseError) else None
            if refused is None:  # may this user end a wait? (a client that is not blocked: answers 0)
                [probe] = await resp.exchange(conn, resp.command(b"CLIENT", b"UNBLOCK", b"%d" % int(client)), 1)
                refused = probe if isinstance(probe, ResponseError) else None
            if refused is not None:
                log.warning(
                    "CLIENT ID / CLIENT UNBLOCK refused (%s): this worker waits for entries and then reads them",
                    refused,
                )
                self._no_unblock = True
                await self.close()
                return None
            self._wait_client = int(client)
        return conn

    def _parse(self, reply: Any, streams: Sequence[str]) -> Read:
        found, drained, tails = reply[:3]
        deliveries: list[Delivery] = []
        malformed: list[tuple[str, bytes]] = []
        for stream_raw, entries in found:
            stream = _text(stream_raw)
            for entry_id, flat in entries:
                try:
                    deliveries.append(parse_entry(stream, entry_id, flat))
                except ValueError:
                    malformed.append((stream, entry_id))
        tail_ids: dict[str, str] = {}
        if int(drained):
            tail_ids = dict.fromkeys(streams, EMPTY_TAIL)
            for index, tail in zip(tails[::2], tails[1::2], strict=True):
                tail_ids[streams[int(index) - 1]] = _text(tail)
        return deliveries, malformed, tail_ids

    async def wait_for_new(
        self,
        tails: dict[str, str],
        block: float,
        stop: asyncio.Future[Any] | None = None,
        streams: Sequence[str] | None = None,
    ) -> set[str] | None:
        """Block until an entry newer than ``tails`` arrives on any stream (or timeout, or ``stop`` is done).

        Returns the streams that answered (empty at the timeout), or None when
        they are not known (a cluster) or ``stop`` ended the wait: the caller
        then reads every stream. The wait is an ``XREAD BLOCK`` per
        :data:`WAIT_GROUP` streams, packed by hiredis and sent raw (redis-py's
        generic packing of 2,000 arguments cost 1.7 ms of worker CPU per wait over
        1,000 streams); it consumes nothing from the group. The groups that did
        not answer stay blocked for the next call (end them with
        :meth:`cancel_waits`). ``stop`` is waited on beside them, in this task:
        the caller reads on as soon as a group answers, with no task of its own
        around the wait (a wake-up went through five turns of the event loop
        before its read went out, 130 µs at the median over 1,000 streams).

        Over more than one group, when ``streams`` is the list the last drained
        whole read (:meth:`read`) covered, the wait is one ``XREAD BLOCK`` on the
        wake-up stream after its cursor instead: Redis registers one key per
        wake-up, not a group of 100 (127 against 10-20 µs of Redis per wake-up
        over 1,000 streams, docs/benchmarks.md), and the entries name the
        streams written. Entries naming none of ``tails``' streams (another
        worker's queues) move the cursor and the wait goes on.
        """
        if not tails:
            return set()
        if self._cluster:
            await self._wait_per_queue(tails, block, stop)
            return None
        if streams is not None and self._wake_cursor(streams) is not None:
            return await self._wait_wake(tails, streams, block, stop)
        await self._cancel_wake_wait()
        streams = list(tails)
        groups = [tuple(streams[i : i + WAIT_GROUP]) for i in range(0, len(streams), WAIT_GROUP)]
        wanted = set(groups)
        stale = [group for group in self._blocked if group not in wanted]  # the active streams changed
        if stale:
            await self._cancel([self._blocked.pop(group) for group in stale])
        if len(groups) == 1 and not self._blocked and stop is None:  # nothing to keep blocked: no task
            return await self._xread(groups[0], tails, block)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0.001:
                    return set()
                for group in groups:
                    if group not in self._blocked:
                        self._blocked[group] = asyncio.ensure_future(self._xread(group, tails, remaining))
                waits: list[asyncio.Future[Any]] = [*self._blocked.values()]
                if stop is not None:
                    waits.append(stop)
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if stop is not None and stop.done():
                    return None  # the groups stay blocked: cancel_waits() ends them
                woken: set[str] = set()
                for group in groups:
                    wait = self._blocked[group]
                    if wait.done():
                        del self._blocked[group]
                        woken |= wait.result()
                if woken:
                    return woken
                # Only timeouts (a group's own block ran out): those groups block again until the deadline.
        except BaseException:
            await self.cancel_waits()
            raise

    async def _wait_wake(
        self, tails: dict[str, str], streams: Sequence[str], block: float, stop: asyncio.Future[Any] | None
    ) -> set[str] | None:
        """:meth:`wait_for_new` on the wake-up stream: the streams of ``tails`` its new entries name."""
        if self._blocked:  # group waits of an earlier wait on the streams themselves
            await self._cancel([*self._blocked.values()])
            self._blocked = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block
        try:
            while True:
                cursor = self._wake_cursor(streams)
                assert cursor is not None  # (only a read of every stream changes it)
                remaining = deadline - loop.time()
                if remaining <= 0.001:
                    self._cursor.timed_out()
                    return set()
                if self._wake_wait is not None and self._wake_wait[0] != cursor:
                    await self._cancel_wake_wait()
                if self._wake_wait is None:
                    self._wake_wait = (cursor, asyncio.ensure_future(self._xread_wake(cursor, remaining)))
                wait = self._wake_wait[1]
                if stop is None:
                    await asyncio.wait([wait], timeout=remaining)
                else:
                    await asyncio.wait([wait, stop], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                    if stop.done():
                        return None  # the wait stays blocked: cancel_waits() ends it
                if not wait.done():
                    continue
                self._wake_wait = None
                last, named = wait.result()
                if last is None:
                    continue  # its own block ran out: again until the deadline
                self._cursor.woke(last)
                woken = {stream for stream in named if stream in tails}
                if woken:
                    return woken
        except BaseException:
            await self.cancel_waits()
            raise

    async def _xread_wake(self, cursor: str, block: float) -> tuple[str | None, set[str]]:
        """One ``XREAD BLOCK`` on the wake-up stream after ``cursor``: the last entry id taken (None at the
        timeout) and the streams the entries name."""
        assert self._wake is not None and self._wake_prefix is not None
        payload = resp.command(
            b"XREAD", b"COUNT", b"%d" % WAKE_COUNT, b"BLOCK", b"%d" % max(1, int(block * 1000)), b"STREAMS",
            self._wake, cursor.encode(),
        )  # fmt: skip
        [reply] = await resp.send_batch(cast(Redis, self._redis), payload, 1)
        if isinstance(reply, ResponseError):
            raise reply
        if not reply:
            return None, set()
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        named: set[str] = set()
        for _entry_id, fields in entries:
            try:
                named |= parse_wake(self._wake_prefix, fields)
            except ValueError:
                log.warning("a malformed wake-up entry: ignored")
        return _text(entries[-1][0]), named

    async def _cancel_wake_wait(self) -> None:
        if self._wake_wait is not None:
            wait, self._wake_wait = self._wake_wait[1], None
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)

    async def cancel_waits(self) -> None:
        """End the wake-up reads still blocked (their connections are dropped: a reply cannot come back later)."""
        waits, self._blocked = list(self._blocked.values()), {}
        await self._cancel(waits)
        await self._cancel_wake_wait()

    async def close(self) -> None:
        """End blocked waits and give :meth:`wait_then_read`'s connection back to the pool."""
        await self.cancel_waits()
        conn, self._wait_conn, self._wait_client = self._wait_conn, None, None
        if conn is not None:
            await cast(Redis, self._redis).connection_pool.release(conn)

    @staticmethod
    async def _cancel(waits: list[asyncio.Future[set[str]]]) -> None:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)

    async def _xread(self, group: tuple[str, ...], tails: dict[str, str], block: float) -> set[str]:
        """One ``XREAD BLOCK`` over ``group`` after its tails: the streams that answered (empty at its timeout)."""
        keys = [self._key(stream) for stream in group]
        payload = resp.command(
            b"XREAD", b"COUNT", b"1", b"BLOCK", b"%d" % max(1, int(block * 1000)), b"STREAMS",
            *keys, *(tails[stream].encode() for stream in group),
        )  # fmt: skip
        [reply] = await resp.send_batch(cast(Redis, self._redis), payload, 1)
        if isinstance(reply, ResponseError):
            raise reply
        if isinstance(reply, dict):  # RESP3 (redis-py's default protocol from 8.0): a map
            return {_text(stream) for stream in reply}
        return {_text(stream) for stream, _entries in reply or ()}  # RESP2: pairs; nil at the timeout

    def _key(self, stream: str) -> bytes:
        """``stream`` encoded, cached (a wait names every stream of the worker)."""
        key = self._keys.get(stream)
        if key is None:
            if len(self._keys) > 100_000:  # queues come and go only with a restart; bound it anyway
                self._keys.clear()
            key = self._keys[stream] = stream.encode()
        return key

    async def _wait_per_queue(self, tails: dict[str, str], block: float, stop: asyncio.Future[Any] | None) -> None:
        """A cluster: one blocking XREAD per queue (an XREAD may not span slots), until the first answers."""
        waits = [
            asyncio.ensure_future(
                self._redis.xread(
                    {key: tails[key] for key in group},
                    count=1,
                    block=max(1, int(block * 1000)),
                )
            )
            for group in by_slot(list(tails))
        ]
        watched: list[asyncio.Future[Any]] = [*waits] if stop is None else [*waits, stop]
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()  # a cancelled read drops its connection: its reply cannot come back later
            await asyncio.gather(*waits, return_exceptions=True)
        for finished in done:
            if finished is stop:
                continue
            error = None if finished.cancelled() else finished.exception()
            if isinstance(error, ResponseError) and str(error).startswith("UNBLOCKED"):
                # The node turned replica (a failover): a wake-up like any other; the
                # next read goes to the new primary (the cluster client follows MOVED).
                log.info("a blocked wait ended by a failover", extra={"error": str(error)})
                return
            if error is not None:
                raise error


class _WaitEnder:
    """Ends one :meth:`Consumer.wait_then_read_until` wait once its stop future is done."""

    def __init__(self, consumer: Consumer, grace: float) -> None:
        self.consumer = consumer
        self.grace = grace
        self.deadline: asyncio.Timeout | None = None
        self.finished = False
        self.task: asyncio.Task[None] | None = None

    def start(self, _stop: asyncio.Future[Any]) -> None:
        if not self.finished and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._end())

    async def _end(self) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.grace
        while not self.finished and loop.time() < give_up:
            # An UNBLOCK sent before Redis blocked the wait finds nothing to end: again.
            with contextlib.suppress(Exception):
                await self.consumer.interrupt_wait()
            await asyncio.sleep(0.05)
        if not self.finished and self.deadline is not None:
            self.deadline.reschedule(loop.time())  # drop the wait: its connection goes with it
