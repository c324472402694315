"""PgQueuer (PostgreSQL, SKIP LOCKED + LISTEN/NOTIFY), used as its docs recommend for throughput.

Settings: the asyncpg driver (its docs: about twice psycopg's throughput);
batch enqueue with list arguments to ``Queries.enqueue``; the worker runs 5
queue managers in one process, each with its own connection and
``batch_size=10`` (the shape of PgQueuer's own benchmark tool: ``-dq 5``,
batch 10), so up to 50 jobs run at once; ``log_aggregation_interval=0`` keeps
the per-job log rows (their ``created`` stamps time the run).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from postbox.app.bench.outbox import Span
from postbox.app.bench.peers.common import PeerConfig, Probe, load, paced
from postbox.app.bench.steady import producers_for

NAME = "pgqueuer"
ENTRYPOINT = "bench_noop"
DEQUEUERS = 5
BATCH = 10


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


async def span(cfg: PeerConfig, ids: list[str]) -> Span:
    conn = await _connect(cfg)
    try:
        row = await conn.fetchrow(
            "SELECT min(created), max(created), count(*),"
            " count(*) FILTER (WHERE created = (SELECT min(created) FROM pgqueuer_log WHERE status = 'successful'))"
            " FROM pgqueuer_log WHERE status = 'successful'"
        )
    finally:
        await conn.close()
    if row is None or row[0] is None:
        return Span(0.0, 0, 0)
    return Span((row[1] - row[0]).total_seconds(), int(row[2]), int(row[3]))


async def work(cfg: PeerConfig) -> None:
    pgq = load("pgqueuer")
    probe = Probe()
    managers = []
    for _ in range(DEQUEUERS):
        qm = pgq.QueueManager(pgq.Queries(pgq.AsyncpgDriver(await _connect(cfg))))

        @qm.entrypoint(ENTRYPOINT)
        async def bench_noop(job: Any) -> None:
            probe.hit(job.id)

        managers.append(qm)
    await asyncio.gather(
        *(
            qm.run(batch_size=BATCH, dequeue_timeout=timedelta(seconds=30), log_aggregation_interval=timedelta(0))
            for qm in managers
        )
    )
