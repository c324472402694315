"""``bench enqueue``: what one enqueue costs a business transaction, and bulk speed.

Business transaction = one INSERT into ``bench_orders`` and one COMMIT, on one
connection, in a loop for ``duration`` seconds; measured without and with one
``jobs.enqueue`` in the same transaction (the two variants alternate per
repetition).  Bulk = ``jobs.enqueue_many`` in batches of ``batch`` jobs, one
commit per batch, validation included.  The outbox is truncated between runs
(no relay runs here) so every run starts from the same table size.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from app.bench import tasks
from app.bench.params import Params
from app.bench.progress import Progress
from app.bench.report import Figure, Target
from jobs import enqueue, enqueue_many

SCENARIO = "enqueue"

SETUP = """
CREATE TABLE IF NOT EXISTS bench_orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id integer NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
)
"""
INSERT_ORDER = "INSERT INTO bench_orders (customer_id, amount) VALUES (%s, %s) RETURNING id"
RESET = "TRUNCATE outbox, job_attempts, bench_orders"


def business_loop(conn: psycopg.Connection[Any], seconds: float, with_enqueue: bool) -> float:
    """Business transactions per second for ``seconds`` (each: INSERT [+ enqueue] + COMMIT)."""
    count = 0
    started = time.perf_counter()
    deadline = started + seconds
    now = started
    while now < deadline:
        row = conn.execute(INSERT_ORDER, (count % 1000, 19.90)).fetchone()
        if with_enqueue and row is not None:
            enqueue(conn, tasks.bench_noop, {"n": row[0]})
        conn.commit()
        count += 1
        now = time.perf_counter()
    return count / (now - started)


def bulk_run(conn: psycopg.Connection[Any], total: int, batch: int) -> float:
    """Jobs per second through ``enqueue_many`` (one commit per batch)."""
    items = [{"task": "bench_noop", "args": {"n": i}} for i in range(batch)]
    done = 0
    started = time.perf_counter()
    while done < total:
        size = min(batch, total - done)
        enqueue_many(conn, items[:size])
        conn.commit()
        done += size
    return done / (time.perf_counter() - started)


def run(database_url: str, params: Params, progress: Progress) -> list[Figure]:
    plain = Figure(SCENARIO, "enqueue.plain_tps", "business tx/s, no enqueue", "tx/s")
    with_job = Figure(SCENARIO, "enqueue.with_job_tps", "business tx/s, with one enqueue", "tx/s")
    ratio = Figure(SCENARIO, "enqueue.ratio", "ratio with/without enqueue", "x", target=Target(">=", 0.80))
    bulk = Figure(
        SCENARIO,
        "enqueue.bulk",
        f"enqueue_many jobs/s (batches of {params.batch})",
        "jobs/s",
        target=Target(">=", 50_000),
    )
    with psycopg.connect(database_url) as conn:
        conn.execute(SETUP)
        conn.commit()
        # warm-up: caches, prepared statements, the registry's model
        business_loop(conn, min(0.5, params.duration / 4), True)
        business_loop(conn, min(0.5, params.duration / 4), False)
        for rep in range(params.repeat):
            conn.execute(RESET)
            conn.commit()
            order = (False, True) if rep % 2 == 0 else (True, False)
            results: dict[bool, float] = {}
            for flag in order:
                results[flag] = business_loop(conn, params.duration, flag)
            plain.values.append(results[False])
            with_job.values.append(results[True])
            ratio.values.append(results[True] / results[False])
            progress.say(
                f"enqueue rep {rep + 1}/{params.repeat}: {results[False]:,.0f} tx/s plain, "
                f"{results[True]:,.0f} tx/s with enqueue ({results[True] / results[False]:.2f})"
            )
        for rep in range(params.repeat):
            conn.execute(RESET)
            conn.commit()
            value = bulk_run(conn, params.jobs, params.batch)
            bulk.values.append(value)
            progress.say(f"enqueue bulk rep {rep + 1}/{params.repeat}: {value:,.0f} jobs/s")
        conn.execute(RESET)
        conn.commit()
    return [plain, with_job, ratio, bulk]
