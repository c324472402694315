"""One look at the streams the leader wrote: which are gone, which lost their newest entries.

About once a second the leading relay asks Redis whether a stream it created a
group on is missing, and whether a stream's last generated id is older than the
newest id the relay wrote to it (a failover to a replica that missed writes):
:meth:`postbox.relay.reconciler.Reconciler.check`. Asked key by key (an
``EXISTS`` and an ``XINFO STREAM`` per stream, each reply parsed by redis-py),
1,000 streams cost the relay 20-30 ms of CPU per look, with publishing stalled
meanwhile: at 200 jobs/s over 100 queues x 10 priorities that stall was the
commit-to-start p99. Here one script per queue (a queue's streams share a hash
slot, so this runs on a cluster too) looks at the queue's streams inside Redis,
compares the ids there, and answers with only the streams found wrong.

Redis runs a script alone and the relay publishes nothing while it waits for
the answer, so one look at 1,000 streams (about 7 ms of Redis, 9 ms in all)
still held back every job committed meanwhile: once a second, the many-queue
commit-to-start p99. A look therefore covers a slice of at most
:data:`LOOK_SLICE` streams (whole queues, in key order) and says where the
next one starts; the relay looks that much more often, so every stream is
still looked at once per check interval. On one server the slices run beside
the publishing (:meth:`postbox.relay.reconciler.Reconciler.check`), a queue's
streams per round trip, so Redis serves the relay's and the workers' commands
between them; the sorted list of streams is kept from one look to the next.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from postbox import redis_conn, resp
from postbox.relay.watermark import EntryId
from postbox.streams import by_slot, queue_tag

# KEYS: streams of one queue. For KEYS[i], ARGV[2i-1] is "1" when the relay created its group (the
# stream must exist) and ARGV[2i] the newest id the relay wrote to it ("" for none).
# Reply: {missing, lost, refused}: the 1-based indexes of the streams gone that must exist, of the
# streams whose last generated id is older than the id written (or gone), and 1 when XINFO was refused.
SCRIPT = """
local function older(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local missing, lost, refused = {}, {}, 0
for i, key in ipairs(KEYS) do
  local must, mark = ARGV[2 * i - 1], ARGV[2 * i]
  if redis.call('EXISTS', key) == 0 then
    if must == '1' then missing[#missing + 1] = i end
    if mark ~= '' then lost[#lost + 1] = i end
  elseif mark ~= '' then
    local info = redis.pcall('XINFO', 'STREAM', key)
    if info.err then
      refused = 1
    else
      for j = 1, #info, 2 do
        if info[j] == 'last-generated-id' then
          if info[j + 1] ~= mark and older(info[j + 1], mark) then lost[#lost + 1] = i end
          break
        end
      end
    end
  end
end
return {missing, lost, refused}
"""


# Streams one look covers at most (whole queues: one queue's streams may take it past this).
LOOK_SLICE = 100


@dataclass
class StreamReport:
    """What one look found (stream keys, sorted)."""

    missing: list[str] = field(default_factory=list)  # a stream the relay created a group on is gone
    lost: list[str] = field(default_factory=list)  # older than the newest id written (or gone)
    refused: bool = False  # the server refuses XINFO: lost tails cannot be told
    resume_after: str | None = None  # a slice: the last stream looked at (None: the look reached the end)
    streams: int = 0  # streams there were to look at, in all (how many slices a whole look takes)


@dataclass(frozen=True)
class Look:
    """One script call: a queue's streams and their arguments."""

    keys: list[str]
    args: list[bytes]


def looks(
    known: Sequence[str] | set[str],
    marks: Mapping[str, EntryId],
    *,
    after: str | None = None,
    limit: int | None = None,
) -> list[Look]:
    """The script calls that look at ``known`` (must exist) and ``marks`` (newest id written), per queue.

    In key order; with ``after``, only the streams after that key; with ``limit``, whole
    queues until at least ``limit`` streams are covered.
    """
    must = set(known)
    return _calls(sliced(sorted(must | set(marks)), after, limit), must, marks)


def sliced(streams: list[str], after: str | None, limit: int | None) -> list[str]:
    """Of ``streams`` (sorted): those after ``after``, and at most ``limit`` of them plus the rest of a queue."""
    if after is not None:
        streams = streams[bisect.bisect_right(streams, after) :]
    if limit is None or len(streams) <= limit:
        return streams
    tag = queue_tag(streams[limit - 1])
    end = limit
    while end < len(streams) and queue_tag(streams[end]) == tag:
        end += 1
    return streams[:end]


def _calls(streams: list[str], must: set[str], marks: Mapping[str, EntryId]) -> list[Look]:
    calls: list[Look] = []
    for group in by_slot(streams):
        args: list[bytes] = []
        for key in group:
            mark = marks.get(key)
            args.append(b"1" if key in must else b"0")
            args.append(b"" if mark is None else b"%d-%d" % mark)
        calls.append(Look(group, args))
    return calls


def report(calls: Sequence[Look], replies: Sequence[Any]) -> StreamReport:
    """The script's replies, one per call, as one :class:`StreamReport`."""
    found = StreamReport()
    for call, (missing, lost, refused) in zip(calls, replies, strict=True):
        found.missing.extend(call.keys[int(i) - 1] for i in missing)
        found.lost.extend(call.keys[int(i) - 1] for i in lost)
        found.refused = found.refused or bool(int(refused))
    found.missing.sort()
    found.lost.sort()
    return found


class StreamCheck:
    """Runs :data:`SCRIPT` over every queue's streams in one write (per node on a cluster)."""

    def __init__(self, redis: redis_conn.AnyRedis) -> None:
        self.redis = redis
        self.cluster = redis_conn.is_cluster(redis)
        self.sha = cast(Redis, redis).register_script(SCRIPT).sha.encode()  # the cluster client has it too
        # The streams to look at, sorted, as the last look found them: a slice is a tenth of 1,000
        # streams, and sorting them all for every slice was most of the relay's time per look.
        self._names: set[str] = set()
        self._sorted: list[str] = []

    async def look(
        self,
        known: Sequence[str] | set[str],
        marks: Mapping[str, EntryId],
        *,
        after: str | None = None,
        limit: int | None = None,
        one_at_a_time: bool = False,
    ) -> StreamReport:
        """Look at the streams (all, or a slice: see :func:`looks`); the report says where a next slice starts.

        ``one_at_a_time``: each call (a queue's streams) in its own round trip, so that Redis
        serves other clients between them (one server; a look beside the publishing)."""
        must = set(known)
        names = must.union(marks)
        if names != self._names:
            self._names, self._sorted = names, sorted(names)
        streams = self._sorted
        chosen = sliced(streams, after, limit)
        calls = _calls(chosen, must, marks)
        if not calls:
            return StreamReport(streams=len(streams))
        for attempt in (1, 2):
            replies = await self._send(calls, one_at_a_time)
            errors = [reply for reply in replies if isinstance(reply, BaseException)]
            if not errors:
                found = report(calls, replies)
                found.streams = len(streams)
                found.resume_after = chosen[-1] if chosen[-1] != streams[-1] else None
                return found
            if attempt == 1 and all(isinstance(error, NoScriptError) for error in errors):
                await self.redis.script_load(SCRIPT)  # a restarted or flushed server; on a cluster, every primary
                continue
            error = errors[0]
            raise error if isinstance(error, RedisError) else RedisConnectionError(str(error))
        raise AssertionError("unreachable")

    async def _send(self, calls: Sequence[Look], one_at_a_time: bool = False) -> list[Any]:
        payloads = [
            resp.command(b"EVALSHA", self.sha, b"%d" % len(call.keys), *(k.encode() for k in call.keys), *call.args)
            for call in calls
        ]
        if one_at_a_time and not self.cluster:
            return [(await resp.send_batch(cast(Redis, self.redis), payload, 1))[0] for payload in payloads]
        return await redis_conn.send(self.redis, [(call.keys[0], p) for call, p in zip(calls, payloads, strict=True)])


__all__ = ["LOOK_SLICE", "SCRIPT", "Look", "StreamCheck", "StreamReport", "looks", "report", "sliced"]
