"""What a statement's plan costs, call by call: ``python -m postbox_bench.plans --jobs 2000 --repeat 2``.

A worker that claims one delivery at a time while a backlog waits (a slow task,
low concurrency) sends one claim, one outcome and, from the relay, one mark per
job. This runs exactly those statements in process, one job per call, over a
backlog of ``--jobs`` claimable rows in a sandbox database: the claim
(``JOB_CLAIM_ATTEMPTS``), the outcome (``JOB_RECORD_OUTCOMES``, succeeded) and,
on a second backlog, the relay's mark (``JOB_MARK_PUBLISHED``). Each session runs under the ``plan_cache_mode`` of
the mode (``auto``: PostgreSQL's default; ``force_custom_plan``: planned at
every call; ``force_generic_plan``: planned once), so a statement's planning
shows as the difference. Printed per statement: wall time per call and its
backend's CPU per call (``/proc/<pid>/schedstat``), in µs; the modes in turn,
``--repeat`` times.

Since migration 0013 the claim, the outcome and the mark run inside functions
that keep their plan whatever the session says (docs/benchmarks.md, "Plans
kept per connection"): under every mode their figures should match
``force_generic_plan``. Run it with an older postbox on ``PYTHONPATH`` to see
what a session planned before.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any, LiteralString

import psycopg

from postbox import enqueue_many, pgarray, sql
from postbox.outcomes import Outcome, outcome_params
from postbox_bench import tasks  # noqa: F401  (registers bench_noop)
from postbox_bench.sandbox import sandbox

MODES = ("auto", "force_custom_plan", "force_generic_plan")
STATEMENTS = ("claim", "outcome", "mark")
WORKER = "postbox-bench-plans"
COUNT_IN_STATE: LiteralString = "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND state = %s"


class Job:
    def __init__(self, job_id: int) -> None:
        self.id = job_id
        self.attempt = 1


def _backlog(conn: psycopg.Connection[Any], jobs: int) -> list[int]:
    ids = enqueue_many(conn, [{"task": "bench_noop", "args": {"n": i}} for i in range(jobs)])
    conn.commit()
    return [int(i) for i in ids]


def _check(conn: psycopg.Connection[Any], ids: list[int], state: str) -> None:
    """Every call did its work: each job is in ``state`` (a refused claim or fence would time nothing)."""
    row = conn.execute(COUNT_IN_STATE, (ids, state)).fetchone()
    conn.commit()
    if row is None or row[0] != len(ids):
        raise RuntimeError(f"{len(ids)} jobs should be {state}, {row[0] if row else 0} are")


def _timed(pid: int, calls: list[Callable[[], object]]) -> tuple[float, float]:
    """(wall µs, backend CPU µs) per call."""

    def cpu_ns() -> int:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])

    cpu, wall = cpu_ns(), time.perf_counter()
    for call in calls:
        call()
    n = max(1, len(calls))
    return (time.perf_counter() - wall) / n * 1e6, (cpu_ns() - cpu) / n / 1e3


def measure(url: str, mode: str, jobs: int) -> dict[str, tuple[float, float]]:
    """One pass of the three statements under ``mode``: statement -> (wall µs, backend CPU µs) per call."""
    statements = sql.active()
    found: dict[str, tuple[float, float]] = {}
    with psycopg.connect(url) as setup, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET plan_cache_mode = {mode}")  # one of MODES, never user input
        pid = conn.info.backend_pid

        def claim(job_id: int) -> None:
            params = {"ids": pgarray.ints([job_id]), "entries": "{1-1}", "worker": WORKER, "lease": 60.0}
            conn.execute(statements.JOB_CLAIM_ATTEMPTS, params).fetchall()

        def outcome(job_id: int) -> None:
            done = Outcome(state="succeeded", kind="succeeded")
            params = outcome_params(WORKER, [(Job(job_id), done)], lambda _job: 0.0, notify=False)
            conn.execute(statements.JOB_RECORD_OUTCOMES, params).fetchall()

        def mark(job_id: int) -> None:
            params = {"ids": pgarray.ints([job_id]), "sids": "{1-1}", "term": None, "attempts": "{0}"}
            conn.execute(statements.JOB_MARK_PUBLISHED, params).fetchall()

        ids = _backlog(setup, jobs)
        found["claim"] = _timed(pid, [lambda i=i: claim(i) for i in ids])
        _check(setup, ids, "running")
        found["outcome"] = _timed(pid, [lambda i=i: outcome(i) for i in ids])
        _check(setup, ids, "succeeded")
        ids = _backlog(setup, jobs)
        found["mark"] = _timed(pid, [lambda i=i: mark(i) for i in ids])
        _check(setup, ids, "queued")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m postbox_bench.plans", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="backlog and calls per statement (default 2000)")
    p.add_argument("--repeat", type=int, default=2, help="passes of every mode (default 2)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        p.error(f"unknown mode(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(MODES)}")
    if args.jobs < 1 or args.repeat < 1:
        p.error("--jobs and --repeat must be at least 1")
    with sandbox(os.environ["POSTBOX_DATABASE_URL"], os.environ["POSTBOX_REDIS_URL"]) as box:
        url = box.database()
        print(f"{'mode':<20}" + "".join(f"{name + ' wall/cpu µs':>24}" for name in STATEMENTS), flush=True)
        for _ in range(args.repeat):
            for mode in modes:
                found = measure(url, mode, args.jobs)
                cells = "".join(f"{f'{found[s][0]:.0f} / {found[s][1]:.0f}':>24}" for s in STATEMENTS)
                print(f"{mode:<20}{cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
