"""SAQ (Redis lists + blocking pops), used as its docs recommend.

Settings: ``Queue.from_url``; ``Queue.enqueue`` sent concurrently, 500 at a
time (SAQ has no batch enqueue apart from ``map``, which also waits for the
results); a worker with the concurrency its configuration names (``"c10"``,
the default, ``"c50"``, ``"c100"``); finished jobs are kept for their default
TTL.  The drain is timed by the handler's in-memory tally.
"""

from __future__ import annotations

import asyncio
from typing import Any

from postbox_bench.peers.common import QUEUE, PeerConfig, Probe, load, paced, variant_of
from postbox_bench.steady import producers_for

NAME = "saq"
CONFIGS = {"c10": 10, "c50": 50, "c100": 100}  # name -> worker concurrency
BEST = "c10"
_probe = Probe()


async def bench_noop(ctx: dict[str, Any]) -> None:
    _probe.hit(ctx["job"].key)


def _queue(cfg: PeerConfig) -> Any:
    return load("saq").Queue.from_url(cfg.redis_url, name=QUEUE)


async def install(cfg: PeerConfig) -> None:
    return None


async def reset(cfg: PeerConfig) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(cfg.redis_url)
    try:
        await client.flushdb()  # the peer's own, otherwise empty, db number
    finally:
        await client.aclose()


async def enqueue_bulk(cfg: PeerConfig, n: int) -> list[str]:
    queue = _queue(cfg)
    ids: list[str] = []
    try:
        for start in range(0, n, 500):
            jobs = await asyncio.gather(*(queue.enqueue("bench_noop") for _ in range(min(500, n - start))))
            ids += [job.key for job in jobs if job is not None]
    finally:
        await queue.disconnect()
    return ids


async def produce(cfg: PeerConfig, rate: float, seconds: float) -> dict[str, float]:
    queue = _queue(cfg)

    async def one(i: int) -> str | None:
        job = await queue.enqueue("bench_noop")
        return None if job is None else str(job.key)

    try:
        return await paced(rate, seconds, [one] * producers_for(rate))
    finally:
        await queue.disconnect()


async def remaining(cfg: PeerConfig) -> int:
    queue = _queue(cfg)
    try:
        return int(await queue.count("incomplete"))
    finally:
        await queue.disconnect()


async def work(cfg: PeerConfig) -> None:
    queue = _queue(cfg)
    worker = load("saq").Worker(
        queue, functions=[("bench_noop", bench_noop)], concurrency=variant_of(cfg, CONFIGS, BEST)
    )
    await worker.start()
