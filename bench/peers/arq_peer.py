"""arq (Redis sorted set + polling), used as its docs recommend.

Settings: ``ArqRedis.enqueue_job`` (arq has no batch enqueue; calls are sent
concurrently, 500 at a time); a worker with the ``max_jobs`` (default 10) and
``poll_delay`` (default 0.5 s: arq polls, it has no blocking read, and it
waits ``poll_delay`` between two polls even when jobs are waiting) its
configuration names; results kept (default 1 h).  The drain is timed by the
handler's in-memory tally.
"""

from __future__ import annotations

import asyncio
from typing import Any

from postbox_bench.peers.common import PeerConfig, Probe, load, paced, variant_of
from postbox_bench.steady import producers_for

NAME = "arq"
# name -> Worker keyword arguments
CONFIGS: dict[str, dict[str, Any]] = {
    "j50-p0.5": {"max_jobs": 50, "poll_delay": 0.5},  # poll_delay at its default
    "j50-p0.05": {"max_jobs": 50, "poll_delay": 0.05},
    "j200-p0.05": {"max_jobs": 200, "poll_delay": 0.05},
    "j200-p0.01": {"max_jobs": 200, "poll_delay": 0.01},
}
BEST = "j50-p0.05"
# redis-py >= 6 caps a pool at 100 connections unless told otherwise (the redis-py < 6 that arq
# pins allowed 2**31), and a caller past the cap gets MaxConnectionsError instead of waiting:
# arq's own knob, RedisSettings.max_connections, sized for the 500 concurrent enqueue calls.
# Opening those 500 connections at once can take more than arq's 1 s connect timeout on a
# loaded machine (TimeoutError), so the timeout is arq's RedisSettings.conn_timeout at 10 s.
MAX_CONNECTIONS = 500
CONNECT_TIMEOUT_S = 10
_probe = Probe()


def _settings(cfg: PeerConfig) -> Any:
    settings = load("arq.connections").RedisSettings.from_dsn(cfg.redis_url)
    settings.max_connections = MAX_CONNECTIONS
    settings.conn_timeout = CONNECT_TIMEOUT_S
    return settings


async def bench_noop(ctx: dict[str, Any]) -> None:
    _probe.hit(ctx["job_id"])


async def _pool(cfg: PeerConfig) -> Any:
    return await load("arq").create_pool(_settings(cfg))


async def install(cfg: PeerConfig) -> None:
    return None


async def reset(cfg: PeerConfig) -> None:
    redis = await _pool(cfg)
    try:
        await redis.flushdb()  # the peer's own, otherwise empty, db number
    finally:
        await redis.aclose()


async def enqueue_bulk(cfg: PeerConfig, n: int) -> list[str]:
    redis = await _pool(cfg)
    ids: list[str] = []
    try:
        for start in range(0, n, 500):
            jobs = await asyncio.gather(*(redis.enqueue_job("bench_noop") for _ in range(min(500, n - start))))
            ids += [job.job_id for job in jobs if job is not None]
    finally:
        await redis.aclose()
    return ids


async def produce(cfg: PeerConfig, rate: float, seconds: float) -> dict[str, float]:
    redis = await _pool(cfg)

    async def one(i: int) -> str | None:
        job = await redis.enqueue_job("bench_noop")
        return None if job is None else str(job.job_id)

    try:
        return await paced(rate, seconds, [one] * producers_for(rate))
    finally:
        await redis.aclose()


async def remaining(cfg: PeerConfig) -> int:
    default_queue_name = load("arq.constants").default_queue_name
    redis = await _pool(cfg)
    try:
        return int(await redis.zcard(default_queue_name))
    finally:
        await redis.aclose()


async def work(cfg: PeerConfig) -> None:
    arq_worker = load("arq.worker")
    worker = arq_worker.Worker(
        functions=[arq_worker.func(bench_noop, name="bench_noop")],
        redis_settings=_settings(cfg),
        handle_signals=False,
        **variant_of(cfg, CONFIGS, BEST),
    )
    await worker.main()
