"""``bench flow``: what flow control costs the jobs it does not limit, and how well it holds a limit.

Three measurements, each on fresh jobs committed in one transaction once the
relay and the workers are up (each worker has written its heartbeat row), with
limits set as *override* rows of ``postbox.limits`` (what an operator's
override writes; workers load them before they consume, and again every
second):

1. **Overhead** (``flow.noop_*``, ``flow.overhead``): ``--jobs`` no-op jobs
   (``bench_noop``) drained by 1 worker process, in two configurations run
   back to back in each repetition: **A**, no limit anywhere; **B**, limits
   in force for that worker but not on the drained task — ``bench_limited``,
   another task of the same queue, at concurrency 2 and 10/s, and the queue
   ``bench_side``, which the worker also consumes (empty), at concurrency 5
   and 100/s. Both configurations run the same command line (queues
   ``bench,bench_side``); the only difference is the rows. The order
   alternates (A B, B A, A B, ...) and the figure is the median of the
   per-repetition ratios B / A, so a machine that drifts over minutes moves
   both sides of each ratio alike. In B every delivery costs one lookup of its
   queue and task among the limits in force, and takes the plain claim.
   Wall-clock jobs/s on a shared machine moves with everything else running;
   the worker's CPU time per job (its threads' scheduler time from ``/proc``, from the
   jobs' commit to the end of the drain) moves much less, so it is reported
   too, paired the same way (``flow.cpu_*``); and, in-process, the work B
   adds to the worker's claim, timed alone (``flow.decision_ns_*``: the truth
   test of the limits per batch, the lookup and list split per delivery, as
   ``Worker._claim`` does them), which bounds what B can cost per job.
2. **Rate** (``flow.rated_*``): ``bench_rated`` at ``--flow-rate`` R/s (an
   override), about ten seconds of it (``min(--jobs, 10 R)`` jobs), drained
   by 2 worker processes. A start is the handler's own ``time.time()``,
   written as ``bench_probe`` writes it (one clock: this machine's). Achieved
   rate = (jobs - 1) / (last start - first start), against R. The peak is the
   fastest run of 5 R consecutive starts (five seconds' worth at the limit),
   as a rate, against R: a limit exceeded shows there, where the whole-run
   mean would hide a burst. (Five seconds, not one: a start may be decided up
   to half an interval ahead of the limiter's start cell, plus 5 ms of clock
   rounding (``postbox.flow``), and a handler starts some milliseconds after
   its claim, more on a loaded machine, so one second may legitimately hold a
   few starts more than R; five seconds bound that to ~1 %.) The longest
   pause between two consecutive starts shows the limiter holding the task
   below its rate.
3. **Concurrency** (``flow.concurrency_*``): ``bench_slow`` (a 50 ms sleep) at
   concurrency 3 (an override), 2 worker processes, ``min(--jobs, 300)``
   jobs. Mean concurrency = the jobs' summed running time (``finished_at -
   started_at``: while a job's outcome is not recorded its slot counts) over
   the span from the first start to the last finish; against 3.

One unmeasured warm-up drain (configuration A) comes first, as in ``bench worker``.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import timeit
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import orjson
import psycopg

from postbox import enqueue_many, flow
from postbox_bench import outbox
from postbox_bench import worker as bench_worker
from postbox_bench.params import Params
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.schedules import cpu_seconds
from postbox_bench.tasks import PROBE_FILE_ENV, QUEUE, SLOW_SECONDS, read_probes

SCENARIO = "flow"
SIDE_QUEUE = "bench_side"
DEFAULT_RATE = 200
RATED_SECONDS = 10  # the rated run holds about this many seconds of starts at the limit
PEAK_SECONDS = 5  # the peak rate: the fastest run of this many seconds' worth of starts at the limit
SLOW_LIMIT = 3
SLOW_JOBS = 300
WARMUP_JOBS = 2_000
DECISION_ROUNDS = 200_000

Override = tuple[str, str, Mapping[str, Any]]  # (scope, name, override)

# Configuration B of the overhead run: limits in force for the worker, none on bench_noop.
ELSEWHERE: tuple[Override, ...] = (
    ("task", "bench_limited", {"concurrency": 2, "rate": "10/s"}),
    ("queue", SIDE_QUEUE, {"concurrency": 5, "rate": "100/s"}),
)

CLEAR: LiteralString = "DELETE FROM postbox.limits"
CLEAR_STATE: LiteralString = "TRUNCATE postbox.limit_slots, postbox.limit_rates"
SET_OVERRIDE: LiteralString = """
INSERT INTO postbox.limits (scope, name, override, override_by, override_at)
VALUES (%(scope)s, %(name)s, %(override)s::jsonb, 'postbox bench', now())
"""
FINISHED: LiteralString = "SELECT count(*) FROM postbox.outbox WHERE finished_at IS NOT NULL"
FORGET_WORKERS: LiteralString = "DELETE FROM postbox.workers"
REGISTERED: LiteralString = (
    "SELECT count(*) FROM postbox.workers WHERE pid = ANY(%(pids)s::int4[]) AND stopped_at IS NULL"
)
IN_FORCE: LiteralString = """
SELECT scope || ' ' || name FROM postbox.limits WHERE declared IS NOT NULL OR override IS NOT NULL ORDER BY 1
"""
RUNNING_TIME: LiteralString = """
SELECT count(*), extract(epoch FROM sum(finished_at - started_at))::float8,
       extract(epoch FROM max(finished_at) - min(started_at))::float8
  FROM postbox.outbox WHERE started_at IS NOT NULL AND finished_at IS NOT NULL
"""


def set_limits(conn: psycopg.Connection[Any], overrides: Sequence[Override]) -> None:
    """Exactly these overrides in ``postbox.limits`` (nothing declared), and no slot or rate cell left."""
    conn.execute(CLEAR)
    conn.execute(CLEAR_STATE)
    for scope, name, override in overrides:
        conn.execute(
            SET_OVERRIDE,
            {"scope": scope, "name": name, "override": orjson.dumps(flow.parse_override(override)).decode()},
        )
    conn.commit()


def in_force(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(IN_FORCE).fetchall()
    conn.commit()
    return [str(row[0]) for row in rows]


def overhead_argv(concurrency: int) -> list[str]:
    """``bench worker``'s worker, consuming ``bench_side`` too (both configurations, same command line)."""
    argv = bench_worker.worker_argv(concurrency)
    argv[argv.index("--queues") + 1] = f"{QUEUE},{SIDE_QUEUE}"
    return argv


@dataclass(frozen=True)
class Run:
    complete: bool  # every job finished before the deadline
    finished: int  # jobs with an outcome
    worker_cpu: float  # CPU seconds of the first worker process from the jobs' commit to the drain's end


def registered(conn: psycopg.Connection[Any], pids: Sequence[int]) -> int:
    row = conn.execute(REGISTERED, {"pids": list(pids)}).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def wait_registered(conn: psycopg.Connection[Any], kids: Children, pids: Sequence[int]) -> None:
    """Until every worker has written its heartbeat row: it is up, about to consume."""
    outbox.wait_until(
        lambda: registered(conn, pids) == len(pids),
        timeout=120.0,
        interval=0.05,
        check=kids.check_alive,
    )


def run_jobs(
    box: Sandbox,
    conn: psycopg.Connection[Any],
    env: dict[str, str],
    *,
    task: str,
    jobs: int,
    overrides: Sequence[Override],
    processes: int,
    argv: list[str],
    batch: int,
) -> Run:
    """Fresh ``jobs`` of ``task`` under exactly ``overrides``, committed at once when the workers are up; drained."""
    outbox.reset(conn)
    conn.execute(FORGET_WORKERS)
    conn.commit()
    box.clean_redis_prefix()
    set_limits(conn, overrides)
    expected = sorted(f"{scope} {name}" for scope, name, _ in overrides)
    with children(env) as kids:
        kids.python("relay", ["postbox.relay", "run"])
        pids = [kids.python(f"worker{i}", argv).pid for i in range(processes)]
        wait_registered(conn, kids, pids)
        for first in range(0, jobs, batch):
            size = min(batch, jobs - first)
            enqueue_many(conn, [{"task": task, "args": {"n": first + i}} for i in range(size)])
        before = cpu_seconds(pids[0])
        conn.commit()  # every job at once
        complete = bench_worker.drain(conn, kids, jobs)
        used = cpu_seconds(pids[0]) - before
    # The workers published what the code declares before they consumed: nothing, or the runs measure other limits.
    found = sorted(in_force(conn))
    if found != expected:
        raise RuntimeError(f"limits in force during the run: {found}, expected {expected}")
    return Run(complete, outbox.scalar(conn, FINISHED), used)


def achieved_rate(times: Sequence[float]) -> float:
    """Starts per second from the first start to the last (the first start opens the span)."""
    if len(times) < 2 or times[-1] <= times[0]:
        return float("nan")
    return (len(times) - 1) / (times[-1] - times[0])


def peak_rate(times: Sequence[float], window: int) -> float:
    """The fastest run of ``window`` consecutive intervals between starts, as starts per second."""
    ordered = sorted(times)
    window = min(window, len(ordered) - 1)
    if window < 1:
        return float("nan")
    shortest = min(ordered[i + window] - ordered[i] for i in range(len(ordered) - window))
    return window / shortest if shortest > 0 else float("inf")


def longest_gap(times: Sequence[float]) -> float:
    ordered = sorted(times)
    return max((b - a for a, b in itertools.pairwise(ordered)), default=float("nan"))


def mean_concurrency(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute(RUNNING_TIME).fetchone()
    conn.commit()
    if row is None or not row[0] or not row[2]:
        return float("nan")
    return float(row[1]) / float(row[2])


def elsewhere_limits() -> flow.Limits:
    """Configuration B's limits as a worker holds them (what ``postbox.worker.flow.load`` builds from the rows)."""
    limits = flow.Limits()
    for scope, name, override in ELSEWHERE:
        limit = flow.effective(None, flow.parse_override(override))
        (limits.queues if scope == "queue" else limits.tasks)[name] = limit
    return limits


def decision_ns(batch: int, rounds: int | None = None) -> float:
    """In-process: what configuration B adds to a claim of ``batch`` unlimited deliveries, per delivery.

    ``postbox.worker.worker.Worker._claim`` with limits in force: one truth test of the limits per
    batch, then one lookup per delivery and the split into plain and limited lists
    (without limits it hands the batch to the plain claim as it is). Best of 5.
    """
    limits = elsewhere_limits()
    assert limits and not limits.limited(QUEUE, "bench_noop")
    deliveries = [(QUEUE, "bench_noop")] * batch

    def claim_split() -> None:
        if not limits:
            return
        plain: list[tuple[str, str]] = []
        limited: list[tuple[str, str]] = []
        for queue, task in deliveries:
            (limited if limits.limited(queue, task) else plain).append((queue, task))

    calls = max(1, (rounds or DECISION_ROUNDS) // batch)
    best = min(timeit.repeat(claim_split, number=calls, repeat=5))
    return best / (calls * batch) * 1e9


TIMED_OUT = " [a run timed out: of the jobs that ran]"


def timed_out(*figures: Figure) -> None:
    """Mark figures measured on a run that did not drain by its deadline (once)."""
    for figure in figures:
        if TIMED_OUT not in figure.label:
            figure.label += TIMED_OUT


def flow_rate(params: Params) -> int:
    rate = int(params.extra.get("flow_rate", DEFAULT_RATE))
    if rate < 1:
        raise ValueError(f"the flow rate must be >= 1 starts/s, got {rate}")
    return rate


def run(
    box: Sandbox,
    database_url: str,
    params: Params,
    progress: Progress,
    worker_env: Mapping[str, str] | None = None,
) -> list[Figure]:
    """The figures above; ``worker_env``: extra environment of the relay and workers (tests)."""
    rate = flow_rate(params)
    rated_jobs = max(2, min(params.jobs, RATED_SECONDS * rate))
    slow_jobs = max(2, min(params.jobs, SLOW_JOBS))
    n = f"{params.jobs:,}"
    plain = Figure(SCENARIO, "flow.noop_unlimited", f"no-op jobs/s, no limit anywhere ({n} jobs, 1 process)", "jobs/s")
    elsewhere = Figure(
        SCENARIO, "flow.noop_limits_elsewhere", f"no-op jobs/s, limits on other task + queue ({n} jobs)", "jobs/s"
    )
    overhead = Figure(
        SCENARIO,
        "flow.overhead",
        "unlimited task's jobs/s, limits elsewhere / none (paired)",
        "ratio",
        target=Target(">=", 0.95),
    )
    cpu_plain = Figure(
        SCENARIO, "flow.cpu_unlimited", "worker CPU per no-op job, no limit anywhere", "µs", higher_is_better=False
    )
    cpu_elsewhere = Figure(
        SCENARIO,
        "flow.cpu_limits_elsewhere",
        "worker CPU per no-op job, limits elsewhere",
        "µs",
        higher_is_better=False,
    )
    cpu_overhead = Figure(
        SCENARIO,
        "flow.cpu_overhead",
        "worker CPU per job, limits elsewhere / none (paired)",
        "ratio",
        target=Target("<=", 1.05),
        higher_is_better=False,
    )
    decision_1 = Figure(
        SCENARIO,
        "flow.decision_ns_1",
        "limits check per unlimited delivery, batches of 1 (in-process)",
        "ns",
        higher_is_better=False,
    )
    decision_c = Figure(
        SCENARIO,
        "flow.decision_ns_c",
        f"limits check per unlimited delivery, batches of {params.concurrency} (in-process)",
        "ns",
        higher_is_better=False,
    )
    achieved = Figure(
        SCENARIO,
        "flow.rated_jobs_s",
        f"rate-limited task at {rate}/s: achieved starts/s ({rated_jobs:,} jobs, 2 processes)",
        "starts/s",
    )
    achieved_ratio = Figure(
        SCENARIO,
        "flow.rated_ratio",
        f"rate-limited task: achieved / limit {rate}/s",
        "ratio",
        target=Target(">=", 0.95),
    )
    peak_ratio = Figure(
        SCENARIO,
        "flow.rated_peak",
        f"rate-limited task: fastest {min(PEAK_SECONDS * rate, rated_jobs - 1):,} starts in a row / limit",
        "ratio",
        target=Target("<=", 1.01),
        higher_is_better=False,
    )
    pause = Figure(
        SCENARIO,
        "flow.rated_longest_pause",
        f"rate-limited task: longest pause between starts (interval {1 / rate:.3g} s)",
        "s",
        higher_is_better=False,
    )
    concurrency = Figure(
        SCENARIO,
        "flow.concurrency_mean",
        f"concurrency {SLOW_LIMIT}, {SLOW_SECONDS * 1000:.0f} ms handler: mean running ({slow_jobs:,} jobs, 2 proc.)",
        "jobs",
    )
    concurrency_ratio = Figure(
        SCENARIO, "flow.concurrency_ratio", f"concurrency-limited task: mean running / limit {SLOW_LIMIT}", "ratio"
    )
    env = bench_env(database_url, box.redis_url, box.prefix, **dict(worker_env or {}))
    side_argv = overhead_argv(params.concurrency)
    plain_argv = bench_worker.worker_argv(params.concurrency)
    with psycopg.connect(database_url) as conn:
        if WARMUP_JOBS:
            run_jobs(
                box,
                conn,
                env,
                task="bench_noop",
                jobs=min(WARMUP_JOBS, params.jobs),
                overrides=(),
                processes=1,
                argv=side_argv,
                batch=params.batch,
            )
            progress.say("flow warm-up run done")
        for rep in range(params.repeat):
            order = [False, True] if rep % 2 == 0 else [True, False]
            got: dict[bool, float] = {}
            cpu: dict[bool, float] = {}
            for limited in order:
                done = run_jobs(
                    box,
                    conn,
                    env,
                    task="bench_noop",
                    jobs=params.jobs,
                    overrides=ELSEWHERE if limited else (),
                    processes=1,
                    argv=side_argv,
                    batch=params.batch,
                )
                figure = elsewhere if limited else plain
                if not done.complete:
                    timed_out(figure)
                got[limited] = outbox.span(conn, outbox.FINISH_SPAN).rate
                cpu[limited] = done.worker_cpu / params.jobs * 1e6
                figure.values.append(got[limited])
                (cpu_elsewhere if limited else cpu_plain).values.append(cpu[limited])
                progress.say(
                    f"flow rep {rep + 1}/{params.repeat} no-op, "
                    f"{'limits elsewhere' if limited else 'no limit'}: {got[limited]:,.0f} jobs/s, "
                    f"worker CPU {cpu[limited]:,.0f} µs/job"
                )
            overhead.values.append(got[True] / got[False])
            cpu_overhead.values.append(cpu[True] / cpu[False])
            decision_1.values.append(decision_ns(1))
            decision_c.values.append(decision_ns(params.concurrency))
            progress.say(
                f"flow rep {rep + 1}/{params.repeat} B/A: jobs/s {overhead.values[-1]:.3f}, "
                f"CPU per job {cpu_overhead.values[-1]:.3f}"
            )

        for rep in range(params.repeat):
            folder = Path(tempfile.mkdtemp(prefix="postbox-bench-flow-"))
            try:
                probe = str(folder / "starts")
                done = run_jobs(
                    box,
                    conn,
                    {**env, PROBE_FILE_ENV: probe},
                    task="bench_rated",
                    jobs=rated_jobs,
                    overrides=(("task", "bench_rated", {"rate": f"{rate}/s"}),),
                    processes=2,
                    argv=plain_argv,
                    batch=params.batch,
                )
                times = sorted(read_probes(probe).values())  # the handlers' own start times
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if not done.complete:  # measure the jobs that started; say so
                timed_out(achieved, achieved_ratio, peak_ratio, pause)
                progress.say(f"flow rep {rep + 1}/{params.repeat} rated: not drained by the deadline")
            if len(times) < done.finished:
                raise RuntimeError(f"{done.finished} rate-limited jobs finished, {len(times)} probe lines written")
            got_rate = achieved_rate(times)
            peak = peak_rate(times, PEAK_SECONDS * rate)
            gap = longest_gap(times)
            achieved.values.append(got_rate)
            achieved_ratio.values.append(got_rate / rate)
            peak_ratio.values.append(peak / rate)
            pause.values.append(gap)
            progress.say(
                f"flow rep {rep + 1}/{params.repeat} rated {rate}/s: achieved {got_rate:,.1f} starts/s "
                f"({got_rate / rate:.3f} of the limit), fastest {PEAK_SECONDS} s {peak:,.1f}/s, "
                f"longest pause {gap:.3f} s"
            )

        for rep in range(params.repeat):
            done = run_jobs(
                box,
                conn,
                env,
                task="bench_slow",
                jobs=slow_jobs,
                overrides=(("task", "bench_slow", {"concurrency": SLOW_LIMIT}),),
                processes=2,
                argv=plain_argv,
                batch=params.batch,
            )
            if not done.complete:
                timed_out(concurrency, concurrency_ratio)
                progress.say(f"flow rep {rep + 1}/{params.repeat} concurrency: not drained by the deadline")
            mean = mean_concurrency(conn)
            concurrency.values.append(mean)
            concurrency_ratio.values.append(mean / SLOW_LIMIT)
            progress.say(f"flow rep {rep + 1}/{params.repeat} concurrency {SLOW_LIMIT}: mean running {mean:.2f}")
        outbox.reset(conn)
        set_limits(conn, ())
    box.clean_redis_prefix()
    return [
        plain,
        elsewhere,
        overhead,
        cpu_plain,
        cpu_elsewhere,
        cpu_overhead,
        decision_1,
        decision_c,
        achieved,
        achieved_ratio,
        peak_ratio,
        pause,
        concurrency,
        concurrency_ratio,
    ]
