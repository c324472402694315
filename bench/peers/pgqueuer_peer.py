"""PgQueuer (PostgreSQL, SKIP LOCKED + LISTEN/NOTIFY), used as its docs recommend for throughput.

Settings: the asyncpg driver (its docs: about twice psycopg's throughput);
batch enqueue with list arguments to ``Queries.enqueue``; one worker process
running ``M`` queue managers, each with its own connection and
``batch_size=B`` (configuration ``"MxB"``: the two knobs of PgQueuer's own
benchmark tool, the number of dequeuers and their batch size), so up to
``M*B`` jobs run at once.  Everything else is PgQueuer's default, log
aggregation included.  The drain is timed by the handler's in-memory tally
(``common.Probe``), not by PgQueuer's tables.

With ``POSTBOX_BENCH_PEER_EFFECT=<pool size>`` (``bench exactly-once``) the
handler instead writes the effect row ``bench_effect`` writes, in a
transaction of its own on an asyncpg pool of that size, and is counted once
that transaction committed.  PgQueuer has no way to commit a handler's effect
together with the job's completion, so this is the nearest it comes to the
exactly-once path: the effect committed, the job acknowledged after it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from postbox_bench.peers.common import PeerConfig, Probe, load, paced
from postbox_bench.steady import producers_for

NAME = "pgqueuer"
ENTRYPOINT = "bench_noop"
# name -> (queue managers, batch_size each); any "MxB" name also works.
CONFIGS = {
    "1x50": (1, 50),  # its docs' shape: one QueueManager, batch_size = concurrency
    "2x25": (2, 25),
    "5x10": (5, 10),  # its benchmark tool's defaults
    "10x5": (10, 5),
}
BEST = "1x50"
EFFECT_ENV = "POSTBOX_BENCH_PEER_EFFECT"  # the handler's pool size: write the effect row (bench exactly-once)
EFFECT_INSERT = "INSERT INTO public.bench_effects (job_id, n) VALUES ($1, 0)"


def shape(cfg: PeerConfig) -> tuple[int, int]:
    name = cfg.variant or BEST
    if name in CONFIGS:
        return CONFIGS[name]
    managers, sep, batch = name.partition("x")
    if sep and managers.isdigit() and batch.isdigit() and int(managers) > 0 and int(batch) > 0:
        return int(managers), int(batch)
    raise ValueError(f"unknown configuration {name!r}; one of {', '.join(CONFIGS)} or MxB")


async def _connect(cfg: PeerConfig) -> Any:
    return await load("asyncpg").connect(cfg.database_url)


async def install(cfg: PeerConfig) -> None:
    pgq = load("pgqueuer")
    conn = await _connect(cfg)
    try:
        await pgq.Queries(pgq.AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def reset(cfg: PeerConfig) -> None:
    conn = await _connect(cfg)
    try:
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
    finally:
        await conn.close()


async def enqueue_bulk(cfg: PeerConfig, n: int) -> list[str]:
    pgq = load("pgqueuer")
    conn = await _connect(cfg)
    ids: list[str] = []
    try:
        queries = pgq.Queries(pgq.AsyncpgDriver(conn))
        for start in range(0, n, 10_000):
            size = min(10_000, n - start)
            got = await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)
            ids += [str(i) for i in got]
    finally:
        await conn.close()
    return ids


async def produce(cfg: PeerConfig, rate: float, seconds: float) -> dict[str, float]:
    pgq = load("pgqueuer")
    conns = [await _connect(cfg) for _ in range(producers_for(rate))]
    try:
        lanes = []
        for conn in conns:
            queries = pgq.Queries(pgq.AsyncpgDriver(conn))

            async def one(i: int, queries: Any = queries) -> str | None:
                (job_id,) = await queries.enqueue(ENTRYPOINT, None)
                return str(job_id)

            lanes.append(one)
        return await paced(rate, seconds, lanes)
    finally:
        for conn in conns:
            await conn.close()


async def remaining(cfg: PeerConfig) -> int:
    conn = await _connect(cfg)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))
    finally:
        await conn.close()


async def work(cfg: PeerConfig) -> None:
    pgq = load("pgqueuer")
    probe = Probe()
    count, batch = shape(cfg)
    pool: Any = None
    if effect_pool := int(os.environ.get(EFFECT_ENV) or 0):
        pool = await load("asyncpg").create_pool(cfg.database_url, min_size=effect_pool, max_size=effect_pool)
    managers = []
    for _ in range(count):
        qm = pgq.QueueManager(pgq.Queries(pgq.AsyncpgDriver(await _connect(cfg))))

        if pool is None:

            @qm.entrypoint(ENTRYPOINT)
            async def bench_noop(job: Any) -> None:
                probe.hit(job.id)

        else:

            @qm.entrypoint(ENTRYPOINT)
            async def bench_effect(job: Any) -> None:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute(EFFECT_INSERT, job.id)
                probe.hit(job.id)

        managers.append(qm)
    await asyncio.gather(*(qm.run(batch_size=batch) for qm in managers))
