"""``python -m postbox_bench.dashboard``: how fast each dashboard page answers on a big outbox.

Creates its own database (``postbox_bench_<random>``, dropped at the end) on the
server named by POSTBOX_DATABASE_URL / DATABASE_URL, fills the outbox with
``--rows`` jobs (default 1,000,000: four queues, five tasks, mostly succeeded
over the last days, some dead, queued, pending and retrying, the newest in the
last hour), starts a real ``postbox api run`` on it and times every request
a dashboard page makes, ``--repeat`` times after a warm-up. Prints the table
(milliseconds, wall clock seen by an HTTP client on this machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx
import psycopg

from postbox.app.dashboard.search import TEXT_WINDOW
from postbox.app.services.checks import encode_cursor
from postbox.errors import SettingsError
from postbox.settings import load_settings
from postbox_bench.sandbox import Sandbox

CHUNK = 100_000
BUDGET_MS = 300.0

# One statement per chunk: ids lo..hi, spread over the last ``span`` seconds, newest last.
FILL = """
INSERT INTO postbox.outbox (queue, task, args, priority, state, attempts, max_attempts, created_at, available_at,
                            published_at, started_at, finished_at, claimed_by, last_error_class, last_error,
                            headers)
SELECT (ARRAY['default', 'emails', 'reports', 'billing'])[1 + i %% 4],
       (ARRAY['send_email', 'render_pdf', 'sync_crm', 'charge', 'resize'])[1 + i %% 5],
       jsonb_build_object('order_id', i, 'email', 'user' || i || '@example.org'),
       5, st, CASE st WHEN 'dead' THEN 5 WHEN 'succeeded' THEN 1 ELSE 0 END, 5, at, at,
       CASE WHEN st = 'pending' THEN NULL ELSE at END,
       CASE WHEN st IN ('succeeded', 'dead') THEN at + interval '20 ms' END,
       CASE WHEN st IN ('succeeded', 'dead') THEN at + interval '50 ms' END,
       CASE WHEN st IN ('succeeded', 'dead') THEN 'worker-' || lpad(to_hex(i %% 16), 8, '0') END,
       CASE WHEN st = 'dead' THEN 'TimeoutError' END,
       CASE WHEN st = 'dead' THEN 'upstream timed out after 30 s' END,
       jsonb_build_object('request_id', 'req-' || i)
  FROM (SELECT i,
               now() - make_interval(secs => (%(total)s - i) * %(step)s) AS at,
               CASE WHEN i %% 200 = 0 THEN 'dead' WHEN i %% 997 = 0 THEN 'queued'
                    WHEN i %% 1009 = 0 THEN 'pending' WHEN i %% 1013 = 0 THEN 'retrying'
                    ELSE 'succeeded' END AS st
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i) AS g
"""

SIDE_TABLES = """
INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error)
SELECT o.id, a, o.claimed_by, o.started_at, o.finished_at, CASE WHEN a = 5 THEN 'dead' ELSE 'retry' END,
       'TimeoutError', 'Traceback (most recent call last): ... TimeoutError: upstream timed out after 30 s'
  FROM postbox.outbox o, generate_series(1, 5) AS a
 WHERE o.state = 'dead';
INSERT INTO postbox.workers (id, host, pid, queues, concurrency, last_seen, in_flight, processed)
SELECT 'worker-' || lpad(to_hex(i), 8, '0'), 'host-' || (i % 4), 1000 + i, '{default,emails,reports,billing}', 8,
       CASE WHEN i = 15 THEN now() - interval '1 hour' ELSE now() END, i % 8, 60000
  FROM generate_series(0, 15) AS i;
INSERT INTO postbox.relays (id, host, pid, role, term) VALUES ('relay-a', 'host-0', 900, 'leader', 7),
                                                              ('relay-b', 'host-1', 901, 'standby', 7);
INSERT INTO postbox.schedules (name, task, queue, priority, max_attempts, every_seconds, cursor_at, next_run_at)
SELECT 'sched-' || i, 'send_email', 'emails', 5, 3, 60 * i, now(), now() + make_interval(mins => i)
  FROM generate_series(1, 50) AS i;
"""


def fill(url: str, rows: int, span_seconds: float, log: bool = True) -> dict[str, int]:
    """``rows`` jobs and the side tables; returns ids the timings ask for (a dead letter, the newest job)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(1, rows + 1, CHUNK):
            hi = min(rows, lo + CHUNK - 1)
            conn.execute(FILL, {"lo": lo, "hi": hi, "total": rows, "step": span_seconds / rows})
            if log:
                print(f"  filled {hi:,} / {rows:,} rows", file=sys.stderr)
        conn.execute(SIDE_TABLES)
        conn.execute("VACUUM ANALYZE postbox.outbox")
        conn.execute("VACUUM ANALYZE postbox.job_attempts")
        dead = conn.execute("SELECT max(id) FROM postbox.outbox WHERE state = 'dead'").fetchone()
        newest = conn.execute("SELECT max(id) FROM postbox.outbox").fetchone()
    return {"dead": int(dead[0]) if dead else 1, "newest": int(newest[0]) if newest else 1}


def requests(ids: dict[str, int]) -> list[tuple[str, str]]:
    """(page, path) of every request the dashboard's pages make."""
    cursor_below = encode_cursor(max(1, ids["newest"] + 1 - TEXT_WINDOW))
    day_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 86_400))
    two_days_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 2 * 86_400))
    return [
        ("page (HTML)", "/"),
        ("overview", "/api/v1/dashboard/overview"),
        ("jobs: newest 50", "/api/v1/dashboard/jobs?limit=50"),
        ("jobs: queue + state=dead", "/api/v1/dashboard/jobs?queue=default&state=dead&limit=50"),
        ("jobs: task + last 24 h", f"/api/v1/dashboard/jobs?task=charge&since={day_ago}&limit=50"),
        ("jobs: task + state=retrying (rare)", "/api/v1/dashboard/jobs?task=resize&state=retrying&limit=50"),
        ("jobs: created > 48 h ago", f"/api/v1/dashboard/jobs?until={two_days_ago}&limit=50"),
        ("jobs: args text, frequent", "/api/v1/dashboard/jobs?text=user99&limit=50"),
        ("jobs: args text, 1 match", "/api/v1/dashboard/jobs?text=user17%40&limit=50"),
        ("jobs: args text, no match", "/api/v1/dashboard/jobs?text=nobody-at-all&limit=50"),
        ("jobs: args text, next window", "/api/v1/dashboard/jobs?text=nobody-at-all&limit=50&cursor=" + cursor_below),
        ("jobs: count all (capped)", "/api/v1/dashboard/jobs/count"),
        ("jobs: count state=dead", "/api/v1/dashboard/jobs/count?state=dead"),
        ("jobs: count args text (newest window)", "/api/v1/dashboard/jobs/count?text=user17%40"),
        ("jobs: count created > 48 h ago", f"/api/v1/dashboard/jobs/count?until={two_days_ago}"),
        ("job (deep link)", f"/api/v1/dashboard/jobs/{ids['dead']}"),
        ("dead letters", "/api/v1/dashboard/jobs?state=dead&discarded=false&limit=50"),
        ("queues", "/api/v1/dashboard/queues"),
        ("(REST GET /api/v1/queues, for comparison)", "/api/v1/queues"),
        ("workers", "/api/v1/workers"),
        ("schedules", "/api/v1/schedules"),
    ]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def measure(url: str, plan: Sequence[tuple[str, str]], repeat: int, key: str) -> list[tuple[str, str, list[float]]]:
    out = []
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30) as client:
        for name, path in plan:
            for _ in range(2):  # warm-up: connection, plans, caches
                client.get(path).raise_for_status()
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                client.get(path).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
            out.append((name, path, times))
    return out


def render(rows: int, results: Sequence[tuple[str, str, list[float]]]) -> str:
    lines = [
        f"dashboard requests with {rows:,} outbox rows (ms; budget {BUDGET_MS:.0f} ms)",
        "",
        "| page / request | median | p95 | max | within budget |",
        "|---|---:|---:|---:|---|",
    ]
    for name, _, times in results:
        ordered = sorted(times)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        ok = "yes" if p95 < BUDGET_MS else "NO"
        lines.append(f"| {name} | {statistics.median(times):.1f} | {p95:.1f} | {max(times):.1f} | {ok} |")
    return "\n".join(lines)


def run(rows: int, repeat: int, span_hours: float) -> str:
    settings = load_settings()
    server_url = settings.require_database_url()
    redis_url = settings.require_redis_url()
    sandbox = Sandbox(server_url, redis_url)
    key = "bench-key"
    proc: subprocess.Popen[bytes] | None = None
    try:
        url = sandbox.database("dash")
        print(f"filling {rows:,} rows into {url.rsplit('/', 1)[-1]}...", file=sys.stderr)
        started = time.monotonic()
        ids = fill(url, rows, span_hours * 3600)
        print(f"filled in {time.monotonic() - started:.0f} s; starting postbox api run", file=sys.stderr)
        env = {k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL",)}
        port = _free_port()
        env.update(
            POSTBOX_DATABASE_URL=url,
            POSTBOX_REDIS_URL=redis_url,
            POSTBOX_REDIS_PREFIX=sandbox.prefix,
            POSTBOX_API_KEY=key,
        )
        argv = [sys.executable, "-m", "postbox.app", "api", "run", "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not _healthy(base):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("postbox api run did not start")
            time.sleep(0.2)
        results = measure(base, requests(ids), repeat, key)
        return render(rows, results)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        sandbox.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m postbox_bench.dashboard", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="outbox rows (default 1000000)")
    p.add_argument("--repeat", type=int, default=20, help="timed requests per row of the table (default 20)")
    p.add_argument("--span-hours", type=float, default=72.0, help="the rows' creation times span (default 72)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.repeat < 1 or args.span_hours <= 0:
        p.error("--rows and --repeat must be >= 1, --span-hours > 0")
    try:
        print(run(args.rows, args.repeat, args.span_hours))
    except SettingsError as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
