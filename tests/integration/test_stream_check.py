"""The relay's once-a-second look at its streams (relay/stream_check.py) against a real Redis.

A private server: the test writes stream ids of its choosing and flushes the script cache.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from postbox.relay.stream_check import StreamCheck, StreamReport
from tests.harness.redis_server import RedisServer


async def test_gone_streams_and_tails_older_than_the_mark_are_found_by_number_not_by_text(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url)
    try:

        async def stream(key: str, last: str) -> None:
            await client.xadd(key, {"n": "1"}, id=last)

        await stream("p:{a}:p9", "5-1")  # at its mark
        await stream("p:{a}:p8", "4-0")  # ahead of its mark (another relay wrote since)
        await stream("p:{a}:p7", "6-9")  # behind: 7-0 was written, the tail is lost
        await stream("p:{b}:p9", "9-10")  # ahead: 9-10 > 9-9, though "9-10" < "9-9" as text
        await stream("p:{b}:p8", "9-99")  # behind: 9-99 < 10-0, though "9-99" > "10-0" as text
        await stream("p:{b}:p7", "1700000000000-3")  # behind in the sequence part: 3 < 12
        await stream("p:{c}:p0", "1-0")  # known, no mark: only its existence matters
        await client.set("p:{d}:p0", "not a stream")  # XINFO refused here: unknown, not lost
        known = {"p:{a}:p9", "p:{a}:p6", "p:{c}:p0", "p:{c}:p1"}
        marks = {
            "p:{a}:p9": (5, 1),
            "p:{a}:p8": (3, 0),
            "p:{a}:p7": (7, 0),
            "p:{a}:p6": (2, 0),  # gone: both missing (known) and lost (marked)
            "p:{b}:p9": (9, 9),
            "p:{b}:p8": (10, 0),
            "p:{b}:p7": (1700000000000, 12),
            "p:{d}:p0": (1, 0),
        }
        check = StreamCheck(client)
        expected = StreamReport(
            missing=["p:{a}:p6", "p:{c}:p1"],
            lost=["p:{a}:p6", "p:{a}:p7", "p:{b}:p7", "p:{b}:p8"],
            refused=True,
            streams=10,
        )
        assert await check.look(known, marks) == expected

        # In slices of at least 3 streams, whole queues: {a} (4), {b} (3), {c} and {d} (3), then round again.
        slices = []
        after = None
        for _ in range(4):
            found = await check.look(known, marks, after=after, limit=3)
            slices.append(found)
            after = found.resume_after
        assert slices == [
            StreamReport(missing=["p:{a}:p6"], lost=["p:{a}:p6", "p:{a}:p7"], resume_after="p:{a}:p9", streams=10),
            StreamReport(lost=["p:{b}:p7", "p:{b}:p8"], resume_after="p:{b}:p9", streams=10),
            StreamReport(missing=["p:{c}:p1"], refused=True, streams=10),
            StreamReport(missing=["p:{a}:p6"], lost=["p:{a}:p6", "p:{a}:p7"], resume_after="p:{a}:p9", streams=10),
        ]

        # A restarted or flushed server has no script: loaded and asked again.
        await client.script_flush()
        assert await check.look(known, marks) == expected
        assert await check.look(set(), {}) == StreamReport()
        await client.delete("p:{d}:p0")
        assert await check.look({"p:{a}:p9"}, {"p:{a}:p9": (5, 1)}) == StreamReport(streams=1)
        # A slice starting past the last stream (streams were forgotten since) finds nothing and starts over.
        assert await check.look({"p:{a}:p9"}, {}, after="p:{z}:p0", limit=3) == StreamReport(streams=1)
    finally:
        await client.aclose()
