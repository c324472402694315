"""In-process A/B of two hot paths, CPU per job: ``python -m postbox_bench.paths enqueue|transaction VARIANT N``.

Each run makes a sandbox database, drives ``N`` jobs at concurrency 10 (enqueue) or
20 (transaction) on an ``AsyncConnectionPool`` under uvloop (as the worker and the
API run), and prints this process's CPU per job (``time.process_time``) and the
CPU of its PostgreSQL backends (``/proc/<pid>/schedstat``). Alternate two variants
(A B A B ...) and compare pair by pair; CPU time holds on a loaded machine where
wall time does not.

- ``enqueue general``: the REST enqueue's database part through
  ``postbox.app.services.jobs.enqueue`` (BEGIN, insert, read-back, COMMIT);
  ``enqueue one-statement``: what ``POST /api/v1/jobs`` does for a job with no
  dedup key, no unique rule and no depth limit (BEGIN, JOB_INSERT_RETURNING_JOB, COMMIT);
  ``enqueue simple-query``: BEGIN and that insert as one simple query with the
  parameters bound on the client, then COMMIT (two round trips, not prepared).
- ``transaction three``: the round trips of ``ctx.transaction()`` (BEGIN + a
  processed row, the body's INSERT, a SELECT standing for the fenced success +
  COMMIT); ``transaction pipeline``: the same with the body, the success and
  COMMIT sent in psycopg's pipeline mode (one wait instead of two).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import uvloop
from psycopg import AsyncClientCursor, AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from postbox import sql
from postbox.app.services import jobs as job_service
from postbox.producer import Limits, prepare
from postbox.registry import default_registry
from postbox_bench import tasks  # noqa: F401  (registers bench_noop)
from postbox_bench.sandbox import sandbox
from postbox_bench.schedules import cpu_seconds

APP = "postbox-bench-paths"
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
LIMITS = Limits(max_payload_bytes=262_144)


async def _announce(job: job_service.Job) -> None:
    return None


async def _enqueue(conn: AsyncConnection[Any], variant: str, i: int) -> None:
    if variant == "general":
        await job_service.enqueue(
            conn, "bench_noop", {"n": i}, registry=default_registry, limits=LIMITS, before_commit=_announce
        )
        return
    row = prepare("bench_noop", {"n": i}, registry=default_registry, limits=LIMITS)
    if variant == "one-statement":
        async with conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(sql.active().JOB_INSERT_RETURNING_JOB, row.params())
            job = job_service.Job(**job_service.job_fields(await cur.fetchone() or {}, []))
            await _announce(job)
        return
    await conn.set_autocommit(True)
    try:
        client = AsyncClientCursor(conn, row_factory=dict_row)
        await client.execute("BEGIN;" + sql.active().JOB_INSERT_RETURNING_JOB, row.params(), prepare=False)
        client.nextset()
        job = job_service.Job(**job_service.job_fields(await client.fetchone() or {}, []))
        await _announce(job)
        await client.execute(b"COMMIT", prepare=False)
    finally:
        await conn.set_autocommit(False)


async def _transaction(conn: AsyncConnection[Any], variant: str, i: int) -> None:
    cur = AsyncClientCursor(conn)
    await cur.execute("BEGIN; INSERT INTO public.paths_done VALUES (%s) RETURNING job_id", (i,), prepare=False)
    cur.nextset()
    await cur.fetchone()
    if variant == "three":
        await conn.execute("INSERT INTO public.paths_effects (job_id, n) VALUES (%s, 0)", (i,))
        await cur.execute("SELECT %s::int8; COMMIT", (i,), prepare=False)
        return
    async with conn.pipeline():
        await conn.execute("INSERT INTO public.paths_effects (job_id, n) VALUES (%s, 0)", (i,))
        await conn.execute("SELECT %s::int8", (i,))
        await conn.execute("COMMIT")


async def _drive(url: str, path: str, variant: str, jobs: int) -> tuple[float, float]:
    concurrency = 10 if path == "enqueue" else 20
    autocommit = path == "transaction"  # the worker's pool is autocommit, the API's is not
    pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
        url,
        min_size=concurrency,
        max_size=concurrency,
        open=False,
        kwargs={"application_name": APP, "autocommit": autocommit},
    )
    await pool.open(wait=True)
    async with pool.connection() as conn:
        pids = [row[0] for row in await (await conn.execute(BACKENDS, (APP,))).fetchall()]
        if not autocommit:
            await conn.commit()
    step = _enqueue if path == "enqueue" else _transaction
    todo = iter(range(jobs))

    async def runner() -> None:
        for i in todo:
            async with pool.connection() as conn:
                await step(conn, variant, i)

    pg_before = sum(cpu_seconds(pid) for pid in pids)
    before = time.process_time()
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    used = time.process_time() - before
    pg_used = sum(cpu_seconds(pid) for pid in pids) - pg_before
    await pool.close()
    return used / jobs * 1e6, pg_used / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    variants = {"enqueue": ("general", "one-statement", "simple-query"), "transaction": ("three", "pipeline")}
    if len(args) != 3 or args[0] not in variants or args[1] not in variants[args[0]]:
        print(f"usage: python -m postbox_bench.paths enqueue|transaction VARIANT N; variants: {variants}")
        return 2
    path, variant, jobs = args[0], args[1], int(args[2])
    with sandbox(os.environ["POSTBOX_DATABASE_URL"], os.environ["POSTBOX_REDIS_URL"]) as box:
        url = box.database()
        if path == "transaction":
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TABLE public.paths_effects (job_id int8, n int)")
                conn.execute("CREATE TABLE public.paths_done (job_id int8 PRIMARY KEY)")
        client, pg = uvloop.run(_drive(url, path, variant, jobs))
    print(f"{path} {variant}: client {client:,.0f} µs/job, PostgreSQL {pg:,.0f} µs/job", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
