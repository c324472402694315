"""The bench's task handlers; worker processes load them with ``--tasks postbox_bench.tasks``.

- ``bench_noop``: does nothing (throughput of the machinery itself).
- ``bench_tx``: opens ``ctx.transaction()`` and does nothing in it (the
  exactly-once path: processed_jobs insert + outcome in one transaction).
- ``bench_effect`` (``bench exactly-once``): ``ctx.transaction()`` writing
  one row to ``public.bench_effects`` (job id, n) — the handler's effect.
- ``bench_probe``: writes ``<job id> <time.time()>`` at handler start to the
  file named by ``POSTBOX_BENCH_PROBE_FILE``, so the bench (same machine, same
  clock) computes commit-to-handler-start latency.  One ``os.write`` of one
  line on an O_APPEND descriptor: atomic between processes, a few µs.
- ``bench_limited``, ``bench_rated``, ``bench_slow`` (``bench flow``): no-ops
  (``bench_rated`` writes the probe line as ``bench_probe`` does, when the
  probe file is set) and a 50 ms sleep that the flow scenario puts under limits with *override*
  rows in ``postbox.limits``. They declare no limit in code on purpose: a
  declaration here would put every bench worker under limits in force, and
  change what the other scenarios measure.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from postbox import task

QUEUE = "bench"
PROBE_FILE_ENV = "POSTBOX_BENCH_PROBE_FILE"

_probe_fd: int | None = None


@task(queue=QUEUE)
async def bench_noop(ctx: Any, n: int = 0) -> None:
    return None


@task(queue=QUEUE)
async def bench_tenant(ctx: Any, tenant_id: str, n: int = 0) -> None:
    """``bench fair``: a no-op of one tenant (the fair queue's key)."""
    return None


@task(queue=QUEUE)
async def bench_tx(ctx: Any, n: int = 0) -> None:
    async with ctx.transaction():
        pass


@task(queue=QUEUE)
async def bench_probe(ctx: Any, n: int = 0) -> None:
    _probe(ctx.job_id, time.time())


def _probe(job_id: int, started: float) -> None:
    global _probe_fd
    if _probe_fd is None:
        path = os.environ.get(PROBE_FILE_ENV)
        if not path:
            return
        _probe_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_probe_fd, f"{job_id} {started:.6f}\n".encode())


@task(queue=QUEUE)
async def bench_limited(ctx: Any, n: int = 0) -> None:
    return None


@task(queue=QUEUE)
async def bench_rated(ctx: Any, n: int = 0) -> None:
    _probe(ctx.job_id, time.time())  # the handler's start, as bench_probe (bench flow's rate is of these)


SLOW_SECONDS = 0.05


@task(queue=QUEUE)
async def bench_slow(ctx: Any, n: int = 0) -> None:
    await asyncio.sleep(SLOW_SECONDS)


def read_probes(path: str) -> dict[int, float]:
    """Job id -> handler start (epoch seconds); the first start of a job wins."""
    starts: dict[int, float] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) == 2:
                    starts.setdefault(int(parts[0]), float(parts[1]))
    except FileNotFoundError:
        pass
    return starts


# ``bench exactly-once``: the effect row a ctx.transaction() job writes (the bench creates the table).
EFFECTS_TABLE = "public.bench_effects"
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS public.bench_effects "
    "(job_id int8 PRIMARY KEY, n int4 NOT NULL, at timestamptz NOT NULL DEFAULT now())"
)
EFFECT_INSERT = "INSERT INTO public.bench_effects (job_id, n) VALUES (%(id)s, %(n)s)"


@task(queue=QUEUE)
async def bench_effect(ctx: Any, n: int = 0) -> None:
    """The exactly-once path with an effect: one row written in the job's own transaction."""
    async with ctx.transaction() as conn:
        await conn.execute(EFFECT_INSERT, {"id": ctx.job_id, "n": n})
