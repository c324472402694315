"""``bench fair``: a tenant's late jobs behind another's backlog, with and without a fair queue, paired.

Each repetition runs the same drain twice on a fresh outbox, one relay and one
worker process (``--concurrency``), the queue fair by ``tenant_id`` in one run
(window ``--fair-window``, default ``POSTBOX_FAIR_WINDOW``) and plain in the other:

1. tenant A's backlog of ``--jobs`` ``bench_tenant`` jobs is committed
   (``enqueue_many``, batches of ``--batch``);
2. the relay and the worker start; once ``WARM`` of A's jobs have finished,
   tenant B enqueues ``LATE`` jobs in one transaction;
3. the run waits for every job to finish.

B's *start wait* is its jobs' ``started_at - created_at`` (PostgreSQL's clock on
both sides): the fair queue's promise is that it does not grow with A's backlog,
only with the window. The rate is the whole run's (A and B) from the
``finished_at`` stamps, as ``bench worker`` takes it; the ratio fair / plain per
repetition is held to >= 0.8. Each run checks that every job succeeded once.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, LiteralString

import psycopg

from postbox import enqueue_many, fairness
from postbox_bench import outbox
from postbox_bench.params import Params
from postbox_bench.procs import bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.tasks import QUEUE
from postbox_bench.worker import start_system

SCENARIO = "fair"
LATE = 100  # B's jobs
WARM = 1_000  # A's jobs finished before B enqueues (the system is running at full speed)
TASK = "bench_tenant"

B_WAITS: LiteralString = """
SELECT extract(epoch FROM started_at - created_at)::float8 FROM postbox.outbox
 WHERE args ->> 'tenant_id' = 'b' ORDER BY 1
"""
COUNT_FINISHED: LiteralString = "SELECT count(*) FROM postbox.outbox WHERE finished_at IS NOT NULL"
ONCE: LiteralString = """
SELECT count(*) FILTER (WHERE state = 'succeeded' AND attempts = 1), count(*) FROM postbox.outbox
"""


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) - 1e-9)))
    return ordered[rank - 1]


def _enqueue(conn: psycopg.Connection[Any], tenant: str, count: int, batch: int) -> None:
    done = 0
    while done < count:
        size = min(batch, count - done)
        enqueue_many(conn, [{"task": TASK, "args": {"tenant_id": tenant, "n": done + i}} for i in range(size)])
        done += size
    conn.commit()


def _one_run(
    box: Sandbox, conn: psycopg.Connection[Any], env: dict[str, str], params: Params, fair: bool, window: int | None
) -> tuple[list[float], float, bool]:
    """One drain: (B's start waits, jobs/s of the whole run, drained in time)."""
    outbox.reset(conn)
    box.clean_redis_prefix()
    if fair:
        fairness.declare(conn, QUEUE, by="tenant_id", window=window)
    else:
        fairness.clear(conn, QUEUE)
    conn.commit()
    _enqueue(conn, "a", params.jobs, params.batch)
    late = min(LATE, params.jobs)
    total = params.jobs + late
    complete = True
    with children(env) as kids:
        start_system(kids, 1, params.concurrency)
        outbox.wait_until(
            lambda: outbox.scalar(conn, COUNT_FINISHED) >= min(WARM, params.jobs // 2),
            timeout=120,
            interval=0.05,
            check=kids.check_alive,
        )
        _enqueue(conn, "b", late, params.batch)
        try:
            outbox.wait_until(
                lambda: outbox.scalar(conn, outbox.COUNT_UNFINISHED) == 0,
                timeout=max(120.0, total / 100),
                check=kids.check_alive,
            )
        except TimeoutError:
            complete = False
    once = conn.execute(ONCE).fetchone()
    conn.commit()
    if complete and once != (total, total):
        raise RuntimeError(f"expected {total} jobs succeeded at their first attempt, found {once}")
    waits = [float(row[0]) for row in conn.execute(B_WAITS).fetchall() if row[0] is not None]
    conn.commit()
    return waits, outbox.span(conn, outbox.FINISH_SPAN).rate, complete


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    window = params.extra.get("fair_window")
    n = f"{params.jobs:,}"
    seconds = {"unit": "s", "higher_is_better": False}
    figures = {
        "fair.b_p50": Figure(SCENARIO, "fair.b_p50", f"B's start wait p50, fair queue (A: {n} waiting)", **seconds),
        "fair.b_p99": Figure(SCENARIO, "fair.b_p99", f"B's start wait p99, fair queue (A: {n} waiting)", **seconds),
        "plain.b_p50": Figure(SCENARIO, "plain.b_p50", f"B's start wait p50, plain queue (A: {n} waiting)", **seconds),
        "plain.b_p99": Figure(SCENARIO, "plain.b_p99", f"B's start wait p99, plain queue (A: {n} waiting)", **seconds),
        "fair.rate": Figure(SCENARIO, "fair.rate", "jobs/s of the whole run (A and B), fair queue", "jobs/s"),
        "plain.rate": Figure(SCENARIO, "plain.rate", "jobs/s of the whole run (A and B), plain queue", "jobs/s"),
        "fair.ratio": Figure(
            SCENARIO, "fair.ratio", "fair / plain jobs/s, per repetition", "ratio", target=Target(">=", 0.8)
        ),
    }
    env = bench_env(database_url, box.redis_url, box.prefix)
    with psycopg.connect(database_url) as conn:
        try:
            for rep in range(params.repeat):
                rates: dict[str, float] = {}
                for label in ("plain", "fair"):
                    waits, rate, complete = _one_run(box, conn, env, params, label == "fair", window)
                    suffix = "" if complete else " [a run timed out]"
                    figures[f"{label}.b_p50"].values.append(percentile(waits, 0.5))
                    figures[f"{label}.b_p99"].values.append(percentile(waits, 0.99))
                    figures[f"{label}.rate"].values.append(rate)
                    figures[f"{label}.rate"].label += suffix if suffix not in figures[f"{label}.rate"].label else ""
                    rates[label] = rate
                    progress.say(
                        f"fair rep {rep + 1}/{params.repeat} {label}: B waited p50 {percentile(waits, 0.5):.2f} s,"
                        f" p99 {percentile(waits, 0.99):.2f} s (max {max(waits, default=float('nan')):.2f} s,"
                        f" mean {statistics.fmean(waits) if waits else float('nan'):.2f} s), {rate:,.0f} jobs/s"
                    )
                figures["fair.ratio"].values.append(rates["fair"] / rates["plain"])
        finally:
            fairness.clear(conn, QUEUE)
            conn.commit()
            outbox.reset(conn)
    return list(figures.values())
