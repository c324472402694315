"""arq (Redis sorted set + polling), used as its docs recommend.

Settings: ``ArqRedis.enqueue_job`` (arq has no batch enqueue; calls are sent
concurrently, 500 at a time); a worker with ``max_jobs=50`` (default 10),
``poll_delay`` left at its default (0.5 s: arq polls, it has no blocking
read), results kept (default 1 h): their ``finish_time`` times the run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from postbox.app.bench.outbox import Span
from postbox.app.bench.peers.common import PeerConfig, Probe, load, paced
from postbox.app.bench.steady import producers_for

NAME = "arq"
_probe = Probe()


async def bench_noop(ctx: dict[str, Any]) -> None:
    _probe.hit(ctx["job_id"])


async def _pool(cfg: PeerConfig) -> Any:
    arq = load("arq")
    settings = load("arq.connections").RedisSettings.from_dsn(cfg.redis_url)
    return await arq.create_pool(settings)


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


async def span(cfg: PeerConfig, ids: list[str]) -> Span:
    redis = await _pool(cfg)
    try:
        results = await redis.all_job_results()
    finally:
        await redis.aclose()
    finished = sorted(r.finish_time for r in results if r.success)
    if not finished:
        return Span(0.0, 0, 0)
    first = sum(1 for t in finished if t == finished[0])
    return Span((finished[-1] - finished[0]).total_seconds(), len(finished), first)


async def work(cfg: PeerConfig) -> None:
    arq_worker = load("arq.worker")
    worker = arq_worker.Worker(
        functions=[arq_worker.func(bench_noop, name="bench_noop")],
        redis_settings=load("arq.connections").RedisSettings.from_dsn(cfg.redis_url),
        max_jobs=cfg.concurrency,
        handle_signals=False,
    )
    await worker.main()
