"""``bench growth``: what postbox costs as the work grows. Parts (``--growth``, default all):

- ``drain``: no-op jobs/s of one worker process draining ``--jobs`` (default
  20,000) committed jobs, then ``--big`` (default 1,000,000) — both filled in
  bulk before the relay and the worker start, the rate from ``finished_at``
  as in ``bench worker`` — and the ratio big / small per repetition (target
  >= 0.9: the rate should not depend on how much is waiting). The end of the
  drain is found cheaply (:func:`drain_quietly`): ``bench worker``'s wait,
  a ``count(*)`` of the unfinished rows four times a second, is a
  sequential scan that at a million rows (and their dead versions) keeps a
  core busy and slows the drain it measures.
- ``queues``: one worker process consuming 100 queues (``g000`` ...
  ``g099``) whose jobs are spread evenly over the 10 priorities — 1,000
  streams — against the same worker on 1 queue at one priority: no-op jobs/s
  draining ``--jobs`` committed jobs, and commit-to-handler-start p50/p99 at
  the lowest ``--rate`` (default 200/s) for ``--duration`` seconds (the probe
  of ``bench latency``). Ratios 1,000 streams / 1 stream (targets: jobs/s >= 0.9,
  p99 <= 1.5).
- ``steady``: ``--steady-rate`` (default 1,000) jobs/s, one per transaction,
  for ``--minutes`` (default 20) minutes, with retention running: the relay
  prunes every 10 s (``POSTBOX_PRUNE_INTERVAL``) what finished more than a
  minute ago (``POSTBOX_RETENTION_FINISHED_DAYS`` /
  ``..._PROCESSED_DAYS`` = 60 s). Per minute: commit-to-handler-start p99 (it
  should stay flat). At the end of the first minute and of the last: the
  outbox's rows (count), live and dead tuples (``pg_stat_user_tables``, as
  the statistics collector last saw them) and size on disk
  (``pg_total_relation_size``, table + indexes + TOAST) — bounded, not growing.
  One run whatever ``--repeat`` says. Dead tuples are reclaimed by VACUUM
  only: on a server with ``autovacuum = off`` (test servers often are) the
  bench itself runs ``VACUUM postbox.outbox`` at the end of each minute, as
  autovacuum would, and says so in the labels; otherwise the table would grow
  whatever postbox does.
- ``processes``: no-op jobs/s draining ``--jobs`` with 4 worker processes
  against 1 (same concurrency each), and the ratio per repetition. On a
  2-core machine the relay, PostgreSQL and Redis share the cores with the
  workers, so the gain is bounded by the cores, not by postbox.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, LiteralString

import psycopg

from postbox import enqueue_many
from postbox_bench import outbox
from postbox_bench import worker as bench_worker
from postbox_bench.latency import wait_started
from postbox_bench.params import Params
from postbox_bench.procs import bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.stats import Latency
from postbox_bench.steady import produce
from postbox_bench.tasks import PROBE_FILE_ENV, QUEUE

SCENARIO = "growth"
PARTS = ("drain", "queues", "steady", "processes")
QUEUES = tuple(f"g{i:03d}" for i in range(100))
PRIORITIES = 10
PRUNE_INTERVAL_S = 10
KEEP_FINISHED_S = 60
SECONDS_PER_DAY = 86_400
MANY_PROCESSES = 4

AUTOVACUUM: LiteralString = "SELECT current_setting('autovacuum')::bool"
VACUUM_OUTBOX: LiteralString = "VACUUM postbox.outbox"
LAST_FINISHED: LiteralString = "SELECT (finished_at IS NOT NULL)::int FROM postbox.outbox ORDER BY id DESC LIMIT 1"
TABLE_STATS: LiteralString = """
SELECT (SELECT count(*) FROM postbox.outbox), s.n_live_tup, s.n_dead_tup,
       pg_total_relation_size('postbox.outbox'::regclass)
  FROM pg_stat_user_tables s WHERE s.relid = 'postbox.outbox'::regclass
"""


def spread(i: int) -> Mapping[str, Any]:
    """Job ``i``'s queue and priority: round-robin over the 100 queues, then over the 10 priorities."""
    return {"queue": QUEUES[i % len(QUEUES)], "priority": (i // len(QUEUES)) % PRIORITIES}


def prefill_spread(conn: psycopg.Connection[Any], task: str, count: int, batch: int) -> None:
    done = 0
    while done < count:
        size = min(batch, count - done)
        enqueue_many(conn, [{"task": task, "args": {"n": done + i}, **spread(done + i)} for i in range(size)])
        done += size
    conn.commit()


def drain_quietly(box: Sandbox, conn: psycopg.Connection[Any], env: dict[str, str], params: Params, jobs: int) -> bool:
    """``jobs`` fresh no-op jobs drained by one relay and one worker; False if the deadline passed first.

    Waits for the highest id's outcome first (a backward primary-key scan: one
    row), then counts the unfinished rows once a second until none is left (the
    jobs still running around the last one).
    """
    outbox.reset(conn)
    box.clean_redis_prefix()
    outbox.prefill(conn, "bench_noop", jobs, params.batch)
    with children(env) as kids:
        bench_worker.start_system(kids, 1, params.concurrency)
        try:
            outbox.wait_until(
                lambda: outbox.scalar(conn, LAST_FINISHED) == 1,
                timeout=max(120.0, jobs / 100),
                interval=0.5,
                check=kids.check_alive,
            )
            outbox.wait_until(
                lambda: outbox.scalar(conn, outbox.COUNT_UNFINISHED) == 0,
                timeout=120.0,
                interval=1.0,
                check=kids.check_alive,
            )
        except TimeoutError:
            return False
    found = outbox.states(conn)
    if found != {"succeeded": jobs}:
        raise RuntimeError(f"expected {jobs} succeeded jobs, found {found}")
    return True


def worker_argv(concurrency: int, queues: tuple[str, ...]) -> list[str]:
    argv = bench_worker.worker_argv(concurrency)
    argv[argv.index("--queues") + 1] = ",".join(queues)
    return argv


def _drain(box: Sandbox, url: str, params: Params, progress: Progress) -> list[Figure]:
    small, big = params.jobs, int(params.extra.get("big", 1_000_000))
    low = Figure(SCENARIO, "growth.drain_small", f"no-op jobs/s, 1 process, {small:,} committed", "jobs/s")
    high = Figure(SCENARIO, "growth.drain_big", f"no-op jobs/s, 1 process, {big:,} committed", "jobs/s")
    ratio = Figure(
        SCENARIO, "growth.drain_ratio", f"{big:,} / {small:,} committed (paired)", "x", target=Target(">=", 0.9)
    )
    env = bench_env(url, box.redis_url, box.prefix)
    with psycopg.connect(url) as conn:
        bench_worker.drain_once(box, conn, env, _noop(1), params, min(bench_worker.WARMUP_JOBS, small))
        for rep in range(params.repeat):
            for figure, jobs in ((low, small), (high, big)):
                progress.say(f"growth drain rep {rep + 1}/{params.repeat}: filling {jobs:,} jobs")
                if not drain_quietly(box, conn, env, params, jobs):
                    figure.label += " [a run timed out: rate of the jobs finished]"
                figure.values.append(outbox.span(conn, outbox.FINISH_SPAN).rate)
                progress.say(f"growth drain rep {rep + 1}/{params.repeat} {jobs:,}: {figure.values[-1]:,.0f} jobs/s")
            ratio.values.append(high.values[-1] / low.values[-1])
        outbox.reset(conn)
    return [low, high, ratio]


def _noop(processes: int) -> bench_worker.Variant:
    return bench_worker.Variant(f"growth.noop_{processes}p", "", "bench_noop", processes)


def _queues(box: Sandbox, url: str, params: Params, progress: Progress) -> list[Figure]:
    jobs, rate = params.jobs, min(params.rates)
    streams = len(QUEUES) * PRIORITIES
    figures: dict[str, Figure] = {}
    for key, what in (("one", "1 queue, 1 priority"), ("many", f"{len(QUEUES)} queues x {PRIORITIES} priorities")):
        figures[f"{key}.rate"] = Figure(SCENARIO, f"growth.queues_{key}_rate", f"no-op jobs/s, {what}", "jobs/s")
        for name in ("p50", "p99"):
            figures[f"{key}.{name}"] = Figure(
                SCENARIO,
                f"growth.queues_{key}_{name}",
                f"commit-to-start {name} @ {rate}/s, {what}",
                "ms",
                higher_is_better=False,
            )
    # Issue 30's targets for many queues: throughput at least 0.9x one queue's, p99 at most 1.5x.
    figures["ratio.rate"] = Figure(
        SCENARIO, "growth.queues_rate_ratio", f"jobs/s {streams} / 1 stream", "x", target=Target(">=", 0.9)
    )
    figures["ratio.p99"] = Figure(
        SCENARIO,
        "growth.queues_p99_ratio",
        f"p99 {streams} / 1 stream",
        "x",
        target=Target("<=", 1.5),
        higher_is_better=False,
    )
    folder = Path(tempfile.mkdtemp(prefix="postbox-bench-growth-"))
    with psycopg.connect(url) as conn:
        for rep in range(params.repeat):
            for key, queues in (("one", (QUEUE,)), ("many", QUEUES)):
                options = spread if key == "many" else None
                outbox.reset(conn)
                box.clean_redis_prefix()
                if options is None:
                    outbox.prefill(conn, "bench_noop", jobs, params.batch)
                else:
                    prefill_spread(conn, "bench_noop", jobs, params.batch)
                probe = folder / f"probe-{rep}-{key}.txt"
                env = bench_env(url, box.redis_url, box.prefix, **{PROBE_FILE_ENV: str(probe)})
                with children(env) as kids:
                    kids.python("relay", ["postbox.relay", "run"])
                    kids.python("worker", worker_argv(params.concurrency, queues))
                    if not bench_worker.drain(conn, kids, jobs):
                        figures[f"{key}.rate"].label += " [a run timed out: rate of the jobs finished]"
                    figures[f"{key}.rate"].values.append(outbox.span(conn, outbox.FINISH_SPAN).rate)
                    outbox.reset(conn)
                    warm = produce(url, "bench_probe", rate, 1.0, options)
                    wait_started(probe, warm.commits.keys(), kids.check_alive)
                    measured = produce(url, "bench_probe", rate, params.duration, options)
                    starts = wait_started(probe, measured.commits.keys(), kids.check_alive)
                lat = Latency.of([starts[i] - t for i, t in measured.commits.items()])
                figures[f"{key}.p50"].values.append(lat.p50)
                figures[f"{key}.p99"].values.append(lat.p99)
                probe.unlink(missing_ok=True)
                progress.say(
                    f"growth queues rep {rep + 1}/{params.repeat} {key}: {figures[f'{key}.rate'].values[-1]:,.0f} "
                    f"jobs/s; @ {rate}/s p50 {lat.p50:.2f} ms, p99 {lat.p99:.2f} ms"
                )
            for name in ("rate", "p99"):
                figures[f"ratio.{name}"].values.append(
                    figures[f"many.{name}"].values[-1] / figures[f"one.{name}"].values[-1]
                )
        outbox.reset(conn)
    box.clean_redis_prefix()
    os.rmdir(folder)
    return list(figures.values())


def table_stats(conn: psycopg.Connection[Any]) -> tuple[int, int, int, int]:
    """(rows, live tuples, dead tuples, bytes on disk) of the outbox."""
    row = conn.execute(TABLE_STATS).fetchone()
    conn.commit()
    if row is None:
        return (0, 0, 0, 0)
    return (int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def _steady(box: Sandbox, url: str, params: Params, progress: Progress) -> list[Figure]:
    rate = int(params.extra.get("steady_rate", 1_000))
    minutes = int(params.extra.get("minutes", 20))
    window = float(params.extra.get("minute_seconds", 60.0))  # a "minute" (tests shorten it)
    p99s = [
        Figure(SCENARIO, f"growth.steady_p99_m{m + 1}", f"p99 @ {rate}/s, minute {m + 1}", "ms", higher_is_better=False)
        for m in range(minutes)
    ]
    offered = Figure(SCENARIO, "growth.steady_offered", f"offered rate achieved (asked {rate}/s)", "jobs/s")
    drift = Figure(SCENARIO, "growth.steady_p99_drift", f"p99 minute {minutes} / minute 1", "x", higher_is_better=False)
    stats: dict[str, Figure] = {}
    for when in ("start", "end"):
        moment = "minute 1" if when == "start" else f"minute {minutes}"
        for name, what, unit in (
            ("rows", "rows (count)", "rows"),
            ("live", "live tuples", "tuples"),
            ("dead", "dead tuples", "tuples"),
            ("size", "size on disk (table+indexes)", "MB"),
        ):
            stats[f"{name}_{when}"] = Figure(
                SCENARIO,
                f"growth.steady_{name}_{when}",
                f"outbox {what}, end of {moment}",
                unit,
                higher_is_better=False,
            )
    with psycopg.connect(url, autocommit=True) as check:
        row = check.execute(AUTOVACUUM).fetchone()
    vacuum_here = not (row and row[0])
    if vacuum_here:
        progress.say("growth steady: autovacuum is off on this server; the bench VACUUMs the outbox each minute")
        for figure in stats.values():
            figure.label += " [autovacuum off: VACUUM by the bench each minute]"
    folder = Path(tempfile.mkdtemp(prefix="postbox-bench-growth-"))
    probe = folder / "probe.txt"
    env = bench_env(
        url,
        box.redis_url,
        box.prefix,
        POSTBOX_PRUNE_INTERVAL=str(PRUNE_INTERVAL_S),
        POSTBOX_RETENTION_FINISHED_DAYS=repr(KEEP_FINISHED_S / SECONDS_PER_DAY),
        POSTBOX_RETENTION_PROCESSED_DAYS=repr(KEEP_FINISHED_S / SECONDS_PER_DAY),
        **{PROBE_FILE_ENV: str(probe)},
    )
    minute_commits: list[dict[int, float]] = []
    seconds = 0.0
    with psycopg.connect(url) as conn:
        outbox.reset(conn)
        box.clean_redis_prefix()
        with children(env) as kids:
            kids.python("relay", ["postbox.relay", "run"])
            kids.python("worker", bench_worker.worker_argv(params.concurrency))
            warm = produce(url, "bench_probe", rate, 1.0)
            wait_started(probe, warm.commits.keys(), kids.check_alive)
            for minute in range(minutes):
                produced = produce(url, "bench_probe", rate, window)
                kids.check_alive()
                minute_commits.append(produced.commits)
                seconds += produced.seconds
                if vacuum_here:
                    with psycopg.connect(url, autocommit=True) as maintenance:
                        maintenance.execute(VACUUM_OUTBOX)
                rows, live, dead, size = table_stats(conn)
                progress.say(
                    f"growth steady minute {minute + 1}/{minutes}: {produced.achieved_rate:,.0f} jobs/s offered; "
                    f"outbox {rows:,} rows, {live:,} live / {dead:,} dead tuples, {size / 2**20:,.1f} MB"
                )
                for when, at in (("start", 0), ("end", minutes - 1)):
                    if minute == at:
                        stats[f"rows_{when}"].values.append(rows)
                        stats[f"live_{when}"].values.append(live)
                        stats[f"dead_{when}"].values.append(dead)
                        stats[f"size_{when}"].values.append(size / 2**20)
            every = [job for commits in minute_commits for job in commits]
            starts = wait_started(probe, every, kids.check_alive)
        outbox.reset(conn)
    box.clean_redis_prefix()
    probe.unlink(missing_ok=True)
    os.rmdir(folder)
    for figure, commits in zip(p99s, minute_commits, strict=True):
        figure.values.append(Latency.of([starts[i] - t for i, t in commits.items()]).p99)
    offered.values.append(sum(len(c) for c in minute_commits) / seconds)
    drift.values.append(p99s[-1].values[0] / p99s[0].values[0])
    return [*p99s, drift, offered, *stats.values()]


def _processes(box: Sandbox, url: str, params: Params, progress: Progress) -> list[Figure]:
    one = Figure(SCENARIO, "growth.processes_1", f"no-op jobs/s, 1 worker process ({params.jobs:,} jobs)", "jobs/s")
    many = Figure(
        SCENARIO,
        f"growth.processes_{MANY_PROCESSES}",
        f"no-op jobs/s, {MANY_PROCESSES} worker processes ({params.jobs:,} jobs)",
        "jobs/s",
    )
    ratio = Figure(SCENARIO, "growth.processes_ratio", f"{MANY_PROCESSES} processes / 1 (paired)", "x")
    env = bench_env(url, box.redis_url, box.prefix)
    with psycopg.connect(url) as conn:
        bench_worker.drain_once(box, conn, env, _noop(1), params, min(bench_worker.WARMUP_JOBS, params.jobs))
        for rep in range(params.repeat):
            for figure, processes in ((one, 1), (many, MANY_PROCESSES)):
                complete, _ = bench_worker.drain_once(box, conn, env, _noop(processes), params, params.jobs)
                if not complete:
                    figure.label += " [a run timed out: rate of the jobs finished]"
                figure.values.append(outbox.span(conn, outbox.FINISH_SPAN).rate)
                progress.say(
                    f"growth processes rep {rep + 1}/{params.repeat} x{processes}: {figure.values[-1]:,.0f} jobs/s"
                )
            ratio.values.append(many.values[-1] / one.values[-1])
        outbox.reset(conn)
    box.clean_redis_prefix()
    return [one, many, ratio]


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    chosen = tuple(params.extra.get("growth", PARTS))
    parts = {"drain": _drain, "queues": _queues, "steady": _steady, "processes": _processes}
    figures: list[Figure] = []
    for name in PARTS:
        if name in chosen:
            progress.say(f"growth: {name}")
            figures += parts[name](box, database_url, params, progress)
    return figures
