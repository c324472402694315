"""Where commit-to-start time goes at a steady rate: ``python -m postbox_bench.phases --rate 1000 --jobs 5000``.

One relay and one worker (concurrency 50) run while ``bench_noop`` jobs are
committed one per transaction at ``--rate`` jobs/s
(:func:`postbox_bench.steady.produce`); once drained, the rows' own timestamps
split each job's path: created → published (``published_at`` is the relay's
mark, written just after its XADD: the relay's half, NOTIFY and select
included), published → started (the worker's claim: Redis, the wake-up, the
read and the claim), started → finished (the run and the completer's flush).
p50 and p99 of each, in ms. Times are PostgreSQL's, so no clock is compared
with another. A job a worker claimed before the relay's mark has no
``published_at`` (the mark skips it): it counts in the last two parts only.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, LiteralString

import psycopg

from postbox_bench import outbox
from postbox_bench import worker as bench_worker
from postbox_bench.flow import wait_registered
from postbox_bench.procs import bench_env, children
from postbox_bench.sandbox import sandbox
from postbox_bench.schedules import LEADS
from postbox_bench.steady import produce

SPLITS: LiteralString = """
SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at) * 1000),
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - published_at) * 1000),
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000),
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000)
  FROM postbox.outbox WHERE state = 'succeeded'
"""
PARTS = ("created -> published", "published -> started", "created -> started", "started -> finished")


def measure(rate: float, jobs: int, concurrency: int = 50) -> dict[str, tuple[float, float]]:
    """One run: each part of the path -> (p50, p99) in ms."""
    with sandbox(os.environ["POSTBOX_DATABASE_URL"], os.environ["POSTBOX_REDIS_URL"]) as box:
        url = box.database()
        env = bench_env(url, box.redis_url, box.prefix)
        with psycopg.connect(url) as conn:
            with children(env) as kids:
                kids.python("relay", ["postbox.relay", "run"])
                worker = kids.python("worker", bench_worker.worker_argv(concurrency)).pid
                wait_registered(conn, kids, [worker])
                outbox.wait_until(lambda: outbox.scalar(conn, LEADS) == 1, 60, check=kids.check_alive)
                conn.commit()
                produce(url, "bench_noop", rate, jobs / rate, None)
                if not bench_worker.drain(conn, kids, jobs):
                    raise RuntimeError(f"{jobs} jobs not drained in time")
            row: Any = conn.execute(SPLITS).fetchone()
            outbox.reset(conn)
    return {part: (float(values[0]), float(values[1])) for part, values in zip(PARTS, row, strict=True)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m postbox_bench.phases", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="jobs committed per second (default 1000)")
    p.add_argument("--jobs", type=int, default=5000)
    args = p.parse_args(argv)
    for part, (p50, p99) in measure(args.rate, args.jobs).items():
        print(f"@ {args.rate:g}/s {part:<22} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
