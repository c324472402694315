"""The idle-entry pass over many streams: one script call per slice of streams, in turn (worker/reclaimer.py)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from postbox.streams import GROUP, stream_key
from postbox.worker.consumer import ensure_groups
from postbox.worker.reclaimer import IDLE_SLICE, Reclaimer
from tests.harness.redis_server import RedisServer
from tests.harness.wait import wait_until_async


async def evalsha_calls(client: aioredis.Redis) -> int:
    stats: dict[str, Any] = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_pass_over_450_streams_is_three_calls_and_finds_idle_entries_and_lost_groups_in_every_slice(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, socket_timeout=30)
    streams = [stream_key("slices", f"q{i:03d}", 5) for i in range(450)]
    assert IDLE_SLICE == 200  # slices 0-199, 200-399, 400-449
    idle_at = [0, 250, 449]
    try:
        await ensure_groups(client, streams)
        for i in idle_at:
            await client.xadd(streams[i], {"m": "x"})
            await client.xreadgroup(GROUP, "gone", {streams[i]: ">"}, count=1)  # a dead worker's entry
        await client.delete(streams[320])  # Redis lost this one, group and all
        reclaimer = Reclaimer(client, None, prefix="slices", consumer="me", min_idle=0.001)  # type: ignore[arg-type]
        expected = [streams[i] for i in idle_at]
        await wait_until_async(
            lambda: _when(reclaimer.idle_streams(streams), expected), 10, message="the entries idle for 1 ms"
        )
        before = await evalsha_calls(client)
        assert await reclaimer.idle_streams(streams) == expected
        assert await evalsha_calls(client) - before == 3
        groups = await client.xinfo_groups(streams[320])  # recreated from the second slice's answer
        assert [g["name"] for g in groups] == [GROUP.encode()]
    finally:
        await client.aclose()


async def _when(found: Any, expected: list[str]) -> bool:
    return await found == expected
