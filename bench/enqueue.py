"""``bench enqueue``: what one enqueue costs a business transaction, and bulk speed.

Business transaction = one INSERT into ``bench_orders`` and one COMMIT, on one
connection, in a loop; measured without and with one enqueue in the same
transaction, ``duration`` seconds of each per repetition, in alternating
slices of about a quarter second (in ABBA order, :func:`slice_plan`), so that
both variants see the same machine: this VM's speed drifts by 10-20 % within
minutes, which moved the ratio by as much when each variant ran in one block.
Three ways:

- ``plain connection``: ``postbox.enqueue`` after the INSERT; each statement waits
  for its reply, so the enqueue adds one round trip;
- ``pipeline mode``: the same inside ``conn.pipeline()``, where the enqueue's
  INSERT travels with the COMMIT (ids drawn ahead, see ``postbox.ids``);
- ``one statement``: ``postbox.enqueue()`` called from the business INSERT's own
  statement (``WITH o AS (INSERT ...) SELECT postbox.enqueue(...) FROM o``).

Bulk = ``postbox.enqueue_many`` in batches of ``batch`` jobs, one commit per batch,
validation included.  The outbox is truncated between runs (no relay runs
here) so every run starts from the same table size.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import psycopg

from postbox import enqueue, enqueue_many
from postbox_bench import tasks
from postbox_bench.params import Params
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target

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
INSERT_ORDER_WITH_JOB = """
WITH o AS (INSERT INTO bench_orders (customer_id, amount) VALUES (%s, %s) RETURNING id)
SELECT id, postbox.enqueue('bench_noop', jsonb_build_object('n', id), 'bench') FROM o
"""
MODES = {"": "plain connection", ".pipeline": "pipeline mode", ".statement": "one statement"}
RESET = "TRUNCATE postbox.outbox, postbox.job_attempts, bench_orders"


SLICE_SECONDS = 0.25


def slice_plan(seconds: float, slice_seconds: float = SLICE_SECONDS) -> tuple[float, list[bool]]:
    """(seconds per slice, the variants in order: False without, True with an enqueue).

    Each variant gets ``seconds`` in all; the order is ABBA..., so a steady
    drift of the machine's speed weighs on both variants alike.
    """
    pairs = max(1, round(seconds / slice_seconds))
    order: list[bool] = []
    for i in range(pairs):
        order += [False, True] if i % 2 == 0 else [True, False]
    return seconds / pairs, order


def interleaved_rates(conn: psycopg.Connection[Any], seconds: float, mode: str) -> dict[bool, float]:
    """Business tx/s without (False) and with (True) an enqueue, timed in alternating slices."""
    length, order = slice_plan(seconds)
    counts = {False: 0, True: 0}
    elapsed = {False: 0.0, True: 0.0}
    for with_enqueue in order:
        count, took = timed_loop(conn, length, with_enqueue, mode)
        counts[with_enqueue] += count
        elapsed[with_enqueue] += took
    return {flag: counts[flag] / elapsed[flag] for flag in (False, True)}


def business_loop(conn: psycopg.Connection[Any], seconds: float, with_enqueue: bool, mode: str = "") -> float:
    """Business transactions per second for ``seconds`` (each: INSERT [+ enqueue] + COMMIT)."""
    count, took = timed_loop(conn, seconds, with_enqueue, mode)
    return count / took


def timed_loop(conn: psycopg.Connection[Any], seconds: float, with_enqueue: bool, mode: str) -> tuple[int, float]:
    """(transactions, seconds taken) of a loop of business transactions lasting about ``seconds``."""
    statement = INSERT_ORDER_WITH_JOB if with_enqueue and mode == ".statement" else INSERT_ORDER
    separate = with_enqueue and mode != ".statement"
    with conn.pipeline() if mode == ".pipeline" else nullcontext():
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        now = started
        while now < deadline:
            row = conn.execute(statement, (count % 1000, 19.90)).fetchone()
            if separate and row is not None:
                enqueue(conn, tasks.bench_noop, {"n": row[0]})
            conn.commit()
            count += 1
            now = time.perf_counter()
    return count, now - started


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


@dataclass
class ModeFigures:
    """The three figures of one way to enqueue."""

    mode: str
    plain: Figure
    with_job: Figure
    ratio: Figure

    @classmethod
    def of(cls, suffix: str, mode: str) -> ModeFigures:
        return cls(
            mode,
            Figure(SCENARIO, f"enqueue.plain_tps{suffix}", f"business tx/s, no enqueue ({mode})", "tx/s"),
            Figure(SCENARIO, f"enqueue.with_job_tps{suffix}", f"business tx/s, with one enqueue ({mode})", "tx/s"),
            Figure(
                SCENARIO,
                f"enqueue.ratio{suffix}",
                f"ratio with/without enqueue ({mode})",
                "x",
                target=Target(">=", 0.80),
            ),
        )

    def add(self, plain: float, with_job: float) -> None:
        self.plain.values.append(plain)
        self.with_job.values.append(with_job)
        self.ratio.values.append(with_job / plain)

    def all(self) -> list[Figure]:
        return [self.plain, self.with_job, self.ratio]


def run(database_url: str, params: Params, progress: Progress) -> list[Figure]:
    modes = {suffix: ModeFigures.of(suffix, name) for suffix, name in MODES.items()}
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
        for mode, figures in modes.items():
            # warm-up: caches, prepared statements, the registry's model
            business_loop(conn, min(0.5, params.duration / 4), True, mode)
            business_loop(conn, min(0.5, params.duration / 4), False, mode)
            for rep in range(params.repeat):
                conn.execute(RESET)
                conn.commit()
                results = interleaved_rates(conn, params.duration, mode)
                figures.add(results[False], results[True])
                progress.say(
                    f"enqueue rep {rep + 1}/{params.repeat} ({figures.mode}): {results[False]:,.0f} tx/s plain, "
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
    return [*(figure for figures in modes.values() for figure in figures.all()), bulk]
