"""Take over entries idle past the visibility timeout (XAUTOCLAIM), and rescue lost ones.

A live worker refreshes its own entries' idle time, so only entries of dead or
stalled workers go idle. Reclaimed entries go through the same claim as fresh
ones; PostgreSQL decides whether they run. Ids that XAUTOCLAIM reports deleted
(Redis 7) or returns without fields (Redis 6.2) were lost in transport: their
jobs are made publishable again, so the relay sends them anew.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from postbox import sql
from postbox.redis_conn import AnyRedis, is_cluster, run_script
from postbox.streams import GROUP, by_slot, parse_stream_key
from postbox.worker.consumer import ensure_groups, is_nogroup
from postbox.worker.delivery import Delivery, parse_delivery

log = logging.getLogger(__name__)

MAX_SCANS_PER_STREAM = 10
# Streams per idle-entry script call on one server. Redis runs a script alone: over
# 100 queues x 10 priorities one call for all 1,000 streams held every other client
# back for 2.1 ms (3.5 at most) once a second (docs/benchmarks.md, eighteenth round).
# In slices, sent one after another, others' commands run between them.
IDLE_SLICE = 200

# KEYS: streams. ARGV: group, min idle (ms). Returns the (1-based) indexes of the
# streams holding an entry idle for at least min idle, and of those whose group
# is missing (Redis lost data), as {{idle...}, {missing...}}. The summary
# XPENDING (a count) is cheap; the scan by idle time runs only where anything is
# pending. One call for all of a worker's streams, and no capacity is held.
IDLE_SCRIPT = """
local idle, missing = {}, {}
for i, key in ipairs(KEYS) do
    local summary = redis.pcall('XPENDING', key, ARGV[1])
    if type(summary) == 'table' and summary.err then
        if string.find(summary.err, 'NOGROUP', 1, true) then missing[#missing + 1] = i
        else return summary end
    elseif summary[1] > 0 then
        if #redis.call('XPENDING', key, ARGV[1], 'IDLE', ARGV[2], '-', '+', 1) > 0 then idle[#idle + 1] = i end
    end
end
return {idle, missing}
"""


@dataclass
class Reclaimed:
    deliveries: list[Delivery] = field(default_factory=list)
    malformed: list[tuple[str, bytes]] = field(default_factory=list)
    deleted: dict[str, list[bytes]] = field(default_factory=dict)


def parse_autoclaim(reply: Sequence[Any]) -> tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]], list[bytes]]:
    """(next cursor, entries, deleted ids) from a 2-element (6.2) or 3-element (7.x) reply.

    Entries may come raw (``[id, [f, v, ...]]``) or parsed (``(id, {f: v})``);
    an entry with no fields was deleted.
    """
    if len(reply) not in (2, 3):
        raise ValueError(f"unexpected XAUTOCLAIM reply of {len(reply)} elements")
    cursor = reply[0]
    entries: list[tuple[bytes, dict[bytes, bytes] | None]] = []
    for item in reply[1] or []:
        entry_id, fields = item[0], item[1] if len(item) > 1 else None
        if fields is None or (isinstance(fields, list | dict) and not fields):
            entries.append((entry_id, None))
        elif isinstance(fields, dict):
            entries.append((entry_id, fields))
        else:
            entries.append((entry_id, dict(zip(fields[::2], fields[1::2], strict=True))))
    deleted = list(reply[2]) if len(reply) == 3 and reply[2] else []
    return cursor, entries, deleted


class Reclaimer:
    def __init__(self, redis: AnyRedis, pool: AsyncConnectionPool[Any], *, prefix: str, consumer: str, min_idle: float):
        self._redis = redis
        self._pool = pool
        self._prefix = prefix
        self._consumer = consumer
        self._min_idle_ms = max(1, int(min_idle * 1000))
        self._idle_script = cast(Redis, redis).register_script(IDLE_SCRIPT)  # the cluster client has it too

    async def idle_streams(self, streams: Sequence[str]) -> list[str]:
        """Those of ``streams`` holding an entry idle past the visibility timeout, in their order.

        Asked before any capacity is taken: a pass over a worker's streams (one
        script call per :data:`IDLE_SLICE` streams, in turn; one per queue on a
        Redis Cluster, in parallel) must not keep its reads waiting, and usually
        finds nothing. A missing group is recreated.
        """
        if not streams:
            return []
        args = [GROUP, self._min_idle_ms]
        if is_cluster(self._redis):
            groups = by_slot(streams)
            replies = await asyncio.gather(*(run_script(self._idle_script, group, args) for group in groups))
        else:
            groups = [list(streams[i : i + IDLE_SLICE]) for i in range(0, len(streams), IDLE_SLICE)]
            replies = [await run_script(self._idle_script, group, args) for group in groups]
        idle: set[str] = set()
        missing: list[str] = []
        for group, (found, lost) in zip(groups, replies, strict=True):
            idle.update(group[int(index) - 1] for index in found)
            missing += [group[int(index) - 1] for index in lost]
        if missing:
            await ensure_groups(self._redis, missing)
        return [stream for stream in streams if stream in idle]

    async def reclaim(self, streams: Sequence[str], count: int) -> Reclaimed:
        """Up to ``count`` idle entries, highest priority streams first."""
        out = Reclaimed()
        for stream in streams:
            cursor: bytes | str = b"0-0"
            for _ in range(MAX_SCANS_PER_STREAM):
                want = count - len(out.deliveries) - len(out.malformed)
                if want <= 0:
                    return out
                try:
                    reply = await self._redis.execute_command(
                        "XAUTOCLAIM", stream, GROUP, self._consumer, self._min_idle_ms, cursor, "COUNT", want
                    )
                except Exception as exc:
                    if is_nogroup(exc):
                        await ensure_groups(self._redis, [stream])
                        break
                    raise
                cursor, entries, deleted = parse_autoclaim(reply)
                for entry_id, fields in entries:
                    if fields is None:
                        deleted.append(entry_id)
                        continue
                    try:
                        out.deliveries.append(parse_delivery(stream, entry_id, fields, reclaimed=True))
                    except ValueError:
                        out.malformed.append((stream, entry_id))
                if deleted:
                    out.deleted.setdefault(stream, []).extend(deleted)
                if cursor in (b"0-0", "0-0"):
                    break
        return out

    async def rescue_lost(self, deleted: dict[str, list[bytes]]) -> tuple[list[int], dict[str, list[bytes]]]:
        """Make the jobs of vanished entries publishable again; acknowledge the ids.

        Returns the rescued job ids, and the entry ids whose job still runs under
        a live claim (its owner may be alive; look again once the lease may be stale).
        """
        rescued: list[int] = []
        still_running: dict[str, list[bytes]] = {}
        async with self._pool.connection() as conn:
            for stream, ids in deleted.items():
                queue, priority = parse_stream_key(self._prefix, stream)
                texts = [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
                params = {"queue": queue, "priority": priority, "stream_ids": texts}
                cur = await conn.execute(sql.active().JOB_RELEASE_LOST_ENTRIES, params)
                rescued += [row[0] for row in await cur.fetchall()]
                cur = await conn.execute(sql.active().JOB_GET_RUNNING_STREAM_IDS, params)
                running = [row[0].encode() for row in await cur.fetchall()]
                if running:
                    still_running[stream] = running
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream, ids in deleted.items():
                pipe.xack(stream, GROUP, *ids)
            await pipe.execute(raise_on_error=False)
        if rescued:
            log.warning("entries lost in transport; jobs made publishable again", extra={"count": len(rescued)})
        return rescued, still_running
