"""Read stream entries for this worker: strict priority, never more than free capacity.

One Lua script reads the worker's streams highest priority first
(XREADGROUP ``>`` on each, stopping once ``count`` entries are in hand), so an
available higher-priority entry always comes before a lower one and nothing
beyond free capacity is taken. When the streams are drained the script also
returns each stream's newest entry id; the consumer then blocks on a plain
XREAD after those ids, a wake-up that consumes nothing from the group.
A group that vanished (Redis lost its data) is recreated from ``0``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from postbox import resp
from postbox.streams import GROUP
from postbox.worker.delivery import Delivery, parse_delivery

log = logging.getLogger("postbox.worker.consumer")

# KEYS: streams, highest priority first. ARGV: group, consumer, count.
# Returns {{stream, entries}...} and, when fewer than count were found, each
# stream's newest entry id ('0-0' for an empty stream) for the wake-up XREAD.
READ_SCRIPT = """
local want = tonumber(ARGV[3])
local found = {}
for _, key in ipairs(KEYS) do
    if want <= 0 then break end
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want, 'STREAMS', key, '>')
    if reply then
        local entries = reply[1][2]
        want = want - #entries
        found[#found + 1] = {key, entries}
    end
end
local tails = {}
if want > 0 then
    for i, key in ipairs(KEYS) do
        local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
        if #last > 0 then tails[i] = last[1][1] else tails[i] = '0-0' end
    end
end
return {found, tails}
"""


def is_nogroup(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


async def ensure_groups(redis: Redis, streams: Sequence[str]) -> None:
    """Create the consumer group on every stream (from 0, MKSTREAM); BUSYGROUP is fine."""
    async with redis.pipeline(transaction=False) as pipe:
        for key in streams:
            pipe.xgroup_create(key, GROUP, id="0", mkstream=True)
        replies = await pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
            raise reply


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Consumer:
    def __init__(self, redis: Redis, *, consumer: str) -> None:
        self._redis = redis
        self._script = redis.register_script(READ_SCRIPT)
        self._group_and_consumer = (GROUP.encode(), consumer.encode())

    async def _run_script(self, streams: Sequence[str], count: int) -> Any:
        """EVALSHA of the read script, encoded and sent as one raw command (jobs/resp.py).

        redis-py's Script call packs the command generically and reads the
        reply under its own timeout; this runs once per read, so once per
        claimed batch. A server without the script (restarted, flushed) gets it
        loaded and the call repeated.
        """
        keys = [key.encode() for key in streams]
        payload = resp.command(
            b"EVALSHA", self._script.sha.encode(), b"%d" % len(keys), *keys, *self._group_and_consumer, b"%d" % count
        )
        for attempt in (1, 2):
            [reply] = await resp.send_batch(self._redis, payload, 1)
            if not isinstance(reply, ResponseError):
                return reply
            if attempt == 1 and isinstance(reply, NoScriptError):
                await self._redis.script_load(READ_SCRIPT)
                continue
            raise reply

    async def read(
        self, streams: Sequence[str], count: int
    ) -> tuple[list[Delivery], list[tuple[str, bytes]], dict[str, str]]:
        """Up to ``count`` new entries in priority order, malformed (stream, id) pairs, and tails.

        Tails are empty when ``count`` entries were found (more may be waiting).
        """
        try:
            reply: Any = await self._run_script(streams, count)
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
            log.warning("consumer group missing (Redis lost data?); recreating it from 0")
            await ensure_groups(self._redis, streams)
            reply = await self._run_script(streams, count)
        found, tails = reply
        deliveries: list[Delivery] = []
        malformed: list[tuple[str, bytes]] = []
        for stream_raw, entries in found:
            stream = _text(stream_raw)
            for entry_id, flat in entries:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                try:
                    deliveries.append(parse_delivery(stream, entry_id, fields))
                except ValueError:
                    malformed.append((stream, entry_id))
        tail_ids = {stream: _text(tail) for stream, tail in zip(streams, tails, strict=False)} if tails else {}
        return deliveries, malformed, tail_ids

    async def wait_for_new(self, tails: dict[str, str], block: float) -> None:
        """Block until an entry newer than ``tails`` arrives on any stream (or timeout)."""
        if not tails:
            return
        await self._redis.xread(tails, count=1, block=max(1, int(block * 1000)))  # type: ignore[arg-type]
