"""Procrastinate (PostgreSQL, LISTEN/NOTIFY), used as its docs recommend for throughput.

Settings: ``PsycopgConnector`` with a pool as large as the worker's
concurrency; ``Task.batch_defer_async`` for bulk enqueue; one worker with
``listen_notify=True`` (the default) and the concurrency its configuration
names (``"c10"``, ``"c50"``, ``"c100"``; its docs: concurrency is the knob
for async I/O-bound tasks, default 1); jobs are kept (``delete_jobs="never"``,
the default).  The drain is timed by the handler's in-memory tally.
"""

from __future__ import annotations

from typing import Any, LiteralString

from postbox_bench.peers.common import QUEUE, PeerConfig, Probe, load, paced, variant_of
from postbox_bench.steady import producers_for

NAME = "procrastinate"
CONFIGS = {"c10": 10, "c50": 50, "c100": 100}  # name -> worker concurrency
BEST = "c10"


def _app(cfg: PeerConfig, pool_size: int = 4) -> tuple[Any, Any]:
    procrastinate = load("procrastinate")
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=cfg.database_url, min_size=1, max_size=max(pool_size, 4))
    )
    probe = Probe()

    @app.task(name="bench_noop", queue=QUEUE, pass_context=True)
    async def bench_noop(context: Any) -> None:
        probe.hit(context.job.id)

    return app, bench_noop


async def _sql(cfg: PeerConfig, query: LiteralString) -> Any:
    import psycopg

    async with await psycopg.AsyncConnection.connect(cfg.database_url, autocommit=True) as conn:
        cur = await conn.execute(query)
        return await cur.fetchone() if cur.description else None


async def install(cfg: PeerConfig) -> None:
    app, _ = _app(cfg)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def reset(cfg: PeerConfig) -> None:
    await _sql(cfg, "TRUNCATE procrastinate_jobs CASCADE")


async def enqueue_bulk(cfg: PeerConfig, n: int) -> list[str]:
    app, task = _app(cfg)
    ids: list[str] = []
    async with app.open_async():
        for start in range(0, n, 10_000):
            size = min(10_000, n - start)
            got = await task.batch_defer_async(*({} for _ in range(size)))
            ids += [str(i) for i in got]
    return ids


async def produce(cfg: PeerConfig, rate: float, seconds: float) -> dict[str, float]:
    lanes = producers_for(rate)
    app, task = _app(cfg, pool_size=lanes)

    async def one(i: int) -> str | None:
        return str(await task.defer_async())

    async with app.open_async():
        return await paced(rate, seconds, [one] * lanes)


async def remaining(cfg: PeerConfig) -> int:
    row = await _sql(cfg, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
    return int(row[0])


async def work(cfg: PeerConfig) -> None:
    concurrency = variant_of(cfg, CONFIGS, BEST)
    app, _ = _app(cfg, pool_size=concurrency)
    async with app.open_async():
        await app.run_worker_async(queues=[QUEUE], concurrency=concurrency, wait=True, listen_notify=True)
