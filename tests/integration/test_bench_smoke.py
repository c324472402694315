"""`postbox bench` end to end on the test servers, tiny sizes (smoke tests, not timed tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import psycopg
import redis as syncredis

from postbox.app.bench import flow as bench_flow
from postbox.app.bench import worker as bench_worker
from postbox.app.bench.params import Params
from postbox.app.bench.progress import Progress
from postbox.app.bench.report import Report, render
from postbox.app.bench.sandbox import sandbox
from tests.harness.servers import Servers


def test_bench_enqueue_runs_prints_figures_and_cleans_up(servers: Servers) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(POSTBOX_DATABASE_URL=servers.database_url, POSTBOX_REDIS_URL=servers.redis_url)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "postbox.app",
            "bench",
            "enqueue",
            "--repeat",
            "1",
            "--duration",
            "0.2",
            "--jobs",
            "400",
            "--batch",
            "200",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["machine"]["cores"] == os.cpu_count()
    assert report["machine"]["postgresql"] and report["machine"]["redis"]
    assert report["parameters"]["repeat"] == 1 and report["parameters"]["jobs"] == 400
    figures = {f["key"]: f for f in report["figures"]}
    assert sorted(figures) == [
        "enqueue.bulk",
        "enqueue.plain_tps",
        "enqueue.plain_tps.pipeline",
        "enqueue.plain_tps.statement",
        "enqueue.ratio",
        "enqueue.ratio.pipeline",
        "enqueue.ratio.statement",
        "enqueue.with_job_tps",
        "enqueue.with_job_tps.pipeline",
        "enqueue.with_job_tps.statement",
    ]
    for figure in figures.values():
        assert figure["runs"] == 1 and figure["median"] > 0 and figure["system"] == "postbox"
    assert figures["enqueue.ratio"]["target"] == figures["enqueue.ratio.pipeline"]["target"] == ">= 0.80"
    assert report["notes"] == []
    # progress went to stderr, and the run's own database and keys are gone
    match = re.search(r"database (postbox_bench_[0-9a-f]{8}), redis prefix (\S+)", done.stderr)
    assert match is not None, done.stderr
    with psycopg.connect(servers.database_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE %s", (match.group(1) + "%",))
        assert left.fetchone() == (0,)
    client = syncredis.Redis.from_url(servers.redis_url)
    try:
        assert list(client.scan_iter(match=match.group(2) + "*")) == []
    finally:
        client.close()


def test_bench_worker_runs_each_peer_repetition_right_after_its_own_one_process_run(servers: Servers) -> None:
    """`--peers` pairs repetitions: ``between(rep)`` sees the 1-process no-op run of that rep just finished."""
    seen: list[tuple[int, list[tuple[str, int, int]]]] = []
    params = Params(jobs=300, repeat=2, batch=300, concurrency=10)
    with sandbox(servers.database_url, servers.redis_url) as box:
        url = box.database()

        def between(rep: int) -> None:
            with psycopg.connect(url) as conn:
                rows = conn.execute(
                    "SELECT o.task, count(*), (SELECT count(DISTINCT worker_id) FROM postbox.job_attempts)"
                    " FROM postbox.outbox o WHERE o.state = 'succeeded' GROUP BY o.task"
                ).fetchall()
            seen.append((rep, [(task, count, workers) for task, count, workers in rows]))

        figures = {f.key: f for f in bench_worker.run(box, url, params, Progress(quiet=True), between)}
    assert seen == [(0, [("bench_noop", 300, 1)]), (1, [("bench_noop", 300, 1)])]
    assert [len(figures[key].values) for key in ("worker.noop_1p", "worker.noop_2p", "worker.tx_1p")] == [2, 2, 2]
    assert all(value > 0 for value in figures["worker.noop_1p"].values)


def test_bench_flow_measures_overhead_rate_and_concurrency_and_prints_them(servers: Servers) -> None:
    """`bench flow` at tiny sizes: every figure measured once, the table printed, the limits left clean.

    The workers' visibility timeout is 2 s: a delivery a limit could not hold back (its
    publish not marked yet) waits for it before it is looked at again.
    """
    params = Params(jobs=60, repeat=1, batch=60, concurrency=10, extra={"flow_rate": 50})
    with sandbox(servers.database_url, servers.redis_url) as box:
        url = box.database()
        figures = bench_flow.run(box, url, params, Progress(quiet=True), worker_env={"POSTBOX_VISIBILITY_TIMEOUT": "2"})
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM postbox.limits").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)
    by_key = {f.key: f for f in figures}
    assert sorted(by_key) == [
        "flow.concurrency_mean",
        "flow.concurrency_ratio",
        "flow.cpu_limits_elsewhere",
        "flow.cpu_overhead",
        "flow.cpu_unlimited",
        "flow.decision_ns_1",
        "flow.decision_ns_c",
        "flow.noop_limits_elsewhere",
        "flow.noop_unlimited",
        "flow.overhead",
        "flow.rated_jobs_s",
        "flow.rated_longest_pause",
        "flow.rated_peak",
        "flow.rated_ratio",
    ]
    assert all(len(f.values) == 1 and f.values[0] > 0 for f in figures)
    overhead = by_key["flow.overhead"].values[0]
    assert overhead == by_key["flow.noop_limits_elsewhere"].values[0] / by_key["flow.noop_unlimited"].values[0]
    # The limiter limits: 60 starts at 50/s (a reservation may be honoured up to 50 ms late).
    assert by_key["flow.rated_jobs_s"].values[0] <= 50 * 1.1
    assert by_key["flow.concurrency_mean"].values[0] <= bench_flow.SLOW_LIMIT
    report = Report(machine={}, parameters=params.describe())
    for figure in figures:
        report.add(figure)
    printed = render(report)
    for figure in figures:
        assert figure.label in printed
    assert ">= 0.95" in printed and "<= 1.01" in printed and "<= 1.05" in printed
