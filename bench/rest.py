"""``bench rest``: the REST enqueue path (``POST /api/v1/jobs``) against PostgreSQL's one-row INSERT.

One ``postbox api run`` process (``POSTBOX_API_KEY`` set, the bench's tasks
loaded, nothing else running against the sandbox) is driven by ApacheBench, a
client that is not ours: ``ab -k -c C -n N -p body.json -T application/json
-H 'X-API-Key: ...'`` (``--clients`` C, default 10; ``--requests`` N, default
3000) posting a one-job body (``{"task": "bench_noop", "args": {"n": 1}}``).
req/s is ab's; p50 and p99 come from ab's percentile table (``-e``, ms, the
whole run). Each request checks the key, validates the body, inserts the job
and answers with it; nobody subscribes to the events channel during the
bench, so the insert runs alone in autocommit, without the ``enqueued`` event
(with a subscriber: BEGIN, insert, event, COMMIT).

In the same repetition, right after, the same ab run against the **bare
route** (:mod:`postbox_bench.bare_api`: FastAPI + uvicorn + a psycopg-pool
route that validates the same body and does one one-row INSERT, nothing
else): the floor the REST figure is held to (``rest.ratio_bare``, postbox's
req/s over the bare route's, target >= 0.8). Then the same ab run against the
bare route in its ``--outbox`` form (postbox's own enqueue statement, the
outbox row with its indexes and trigger, instead of a two-column table): what
separates the bare route from postbox in the database, so ``rest.ratio_outbox``
(postbox's req/s over this route's) is what postbox's own Python costs. Then
pgbench with C clients for
``--duration`` seconds, each transaction one ``INSERT`` of one row into a
two-column table (``public.bench_rows``), autocommit: the database's limit
(``rest.ratio``, ab's req/s over pgbench's tps, target >= 0.3), and pgbench
running postbox's own enqueue statement the same way (``rest.pgbench_outbox``:
the outbox row, its indexes and its NOTIFY trigger, no Python at all; the
REST path's own database limit). p99 is held to <= 50 ms at C = 10.

CPU per request, per role: the API process's own (all its threads, from
``/proc/<pid>/task/*/schedstat``) and its PostgreSQL backends' (found by
``application_name``), over each ab run, divided by the requests
(``rest.cpu_api``, ``rest.cpu_api_pg``; ``rest.cpu_bare``,
``rest.cpu_bare_pg`` for the bare route, ``rest.cpu_outbox``,
``rest.cpu_outbox_pg`` for its outbox form). These hold under load where
req/s does not.

ab (Debian/Ubuntu: ``apt-get install apache2-utils``) or pgbench missing: the
figures that need it are skipped with the reason in their label. A few
hundred unmeasured requests warm the API process up first; any non-2xx answer
fails the scenario (the figure would not be the enqueue path's).
"""

from __future__ import annotations

import csv
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, LiteralString

import orjson
import psycopg

from postbox import sql
from postbox_bench import bare_api, outbox, pgbench
from postbox_bench.params import Params
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.schedules import cpu_seconds

SCENARIO = "rest"
AB_MISSING = "ab (ApacheBench) not found on PATH (Debian/Ubuntu: apt-get install apache2-utils)"
WARMUP_REQUESTS = 300
BODY = {"task": "bench_noop", "args": {"n": 1}}
ROWS_DDL: LiteralString = (
    "CREATE TABLE IF NOT EXISTS public.bench_rows (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
)
INSERT_SCRIPT = "INSERT INTO public.bench_rows (at) VALUES (now());\n"


def outbox_insert_script() -> str:
    """postbox's enqueue statement with the bare route's ``--outbox`` values as literals (pgbench syntax)."""
    values = {**bare_api.OUTBOX_VALUES, "task": BODY["task"], "args": orjson.dumps(BODY["args"]).decode()}
    literals = {name: _literal(value) for name, value in values.items()}
    return pgbench.render(sql.active().JOB_INSERT_RETURNING_JOB, literals) + "\n"


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


_RPS = re.compile(r"^Requests per second:\s+([0-9.]+)", re.MULTILINE)
_FAILED = re.compile(r"^Failed requests:\s+(\d+)", re.MULTILINE)
_NON_2XX = re.compile(r"^Non-2xx responses:\s+(\d+)", re.MULTILINE)
_KEEP_ALIVE = re.compile(r"^Keep-Alive requests:\s+(\d+)", re.MULTILINE)
_COMPLETE = re.compile(r"^Complete requests:\s+(\d+)", re.MULTILINE)
API_APP_NAME = "postbox-api"
BARE_APP_NAME = bare_api.APPLICATION_NAME
OUTBOX_APP_NAME = bare_api.OUTBOX_APPLICATION_NAME
BACKENDS: LiteralString = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"


def backends_cpu(conn: psycopg.Connection[Any], application_name: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend whose ``application_name`` is the one given (same machine)."""
    pids = [row[0] for row in conn.execute(BACKENDS, (application_name,)).fetchall()]
    conn.commit()
    out: dict[int, float] = {}
    for pid in pids:
        try:
            out[pid] = cpu_seconds(pid)
        except OSError:  # ended, or PostgreSQL on another machine
            continue
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the backends in both snapshots used between them (a backend new in ``after`` from 0)."""
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(base: str, kids: Children) -> None:
    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    outbox.wait_until(up, 60, interval=0.2, check=kids.check_alive)


def ab(url: str, key: str, body: Path, *, clients: int, requests: int) -> tuple[float, float, float, int]:
    """One ab run: (req/s, p50 ms, p99 ms, keep-alive requests).

    ``-l``: answers differ in length (ids, times), which ab would otherwise count as failed.
    Raises RuntimeError on failed or non-2xx requests.
    """
    with tempfile.TemporaryDirectory(prefix="postbox-ab-") as folder:
        table = Path(folder) / "percentiles.csv"
        argv = [
            "ab",
            "-q",
            "-k",
            "-l",
            "-c",
            str(clients),
            "-n",
            str(requests),
            "-p",
            str(body),
            "-T",
            "application/json",
        ]
        argv += ["-H", f"X-API-Key: {key}", "-e", str(table), url]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise RuntimeError(f"ab exited with {done.returncode}:\n{output[-2000:]}")
        percentiles: dict[int, float] = {}
        with open(table, encoding="utf-8") as handle:
            for row in csv.reader(handle):
                if len(row) == 2 and row[0].strip().isdigit():
                    percentiles[int(row[0])] = float(row[1])
    complete = _COMPLETE.search(output)
    failed = _FAILED.search(output)
    non_2xx = _NON_2XX.search(output)
    rps = _RPS.search(output)
    if complete is None or int(complete.group(1)) != requests or rps is None:
        raise RuntimeError(f"ab did not complete {requests} requests:\n{output[-2000:]}")
    if (failed and int(failed.group(1))) or (non_2xx and int(non_2xx.group(1))):
        raise RuntimeError(f"ab: failed or non-2xx requests:\n{output[-2000:]}")
    keep_alive = _KEEP_ALIVE.search(output)
    return float(rps.group(1)), percentiles[50], percentiles[99], int(keep_alive.group(1)) if keep_alive else 0


def _measured_ab(
    conn: psycopg.Connection[Any], child_pid: int, application_name: str, url: str, key: str, body: Path, **ab_args: int
) -> tuple[tuple[float, float, float, int], float, float]:
    """One ab run with the server's CPU per request in µs: (ab's figures, its process, its backends)."""
    requests = ab_args["requests"]
    pg_before = backends_cpu(conn, application_name)
    own_before = cpu_seconds(child_pid)
    measured = ab(url, key, body, **ab_args)
    own = cpu_seconds(child_pid) - own_before
    pg = cpu_used(pg_before, backends_cpu(conn, application_name))
    return measured, own / requests * 1e6, pg / requests * 1e6


def _measured_route(
    conn: psycopg.Connection[Any],
    kids: Children,
    child_pid: int,
    application_name: str,
    url: str,
    count: LiteralString,
    what: str,
    key: str,
    body: Path,
    **ab_args: int,
) -> tuple[tuple[float, float, float, int], float, float]:
    """:func:`_measured_ab` on one server, checked: ``count`` (a row count) must grow by the requests ab answered."""
    requests = ab_args["requests"]
    before = outbox.scalar(conn, count)
    measured = _measured_ab(conn, child_pid, application_name, url, key, body, **ab_args)
    kids.check_alive()
    if (added := outbox.scalar(conn, count) - before) != requests:
        raise RuntimeError(f"ab answered {requests} requests but {what} {added}")
    return measured


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    clients = int(params.extra.get("clients", 10))
    requests = int(params.extra.get("requests", 3_000))
    seconds = max(1, round(params.duration))
    label = f"-c {clients}, {requests:,} POSTs"
    rps = Figure(SCENARIO, "rest.rps", f"POST /api/v1/jobs req/s, 1 API process (ab -k {label})", "req/s")
    p50 = Figure(SCENARIO, "rest.p50", f"POST /api/v1/jobs p50 (ab {label})", "ms", higher_is_better=False)
    p99 = Figure(
        SCENARIO,
        "rest.p99",
        f"POST /api/v1/jobs p99 (ab {label})",
        "ms",
        target=Target("<=", 50) if clients == 10 else None,
        higher_is_better=False,
    )
    bare_rps = Figure(SCENARIO, "rest.bare_rps", f"bare FastAPI route, one INSERT, req/s (ab -k {label})", "req/s")
    bare_p99 = Figure(SCENARIO, "rest.bare_p99", f"bare FastAPI route p99 (ab {label})", "ms", higher_is_better=False)
    ratio_bare = Figure(
        SCENARIO, "rest.ratio_bare", "REST req/s / bare route req/s (paired)", "x", target=Target(">=", 0.8)
    )
    cpu_api = Figure(SCENARIO, "rest.cpu_api", "API process CPU per request", "µs", higher_is_better=False)
    cpu_api_pg = Figure(
        SCENARIO, "rest.cpu_api_pg", "API's PostgreSQL backends CPU per request", "µs", higher_is_better=False
    )
    cpu_bare = Figure(SCENARIO, "rest.cpu_bare", "bare route process CPU per request", "µs", higher_is_better=False)
    cpu_bare_pg = Figure(
        SCENARIO, "rest.cpu_bare_pg", "bare route's PostgreSQL backends CPU per request", "µs", higher_is_better=False
    )
    outbox_rps = Figure(
        SCENARIO, "rest.outbox_rps", f"bare route, postbox's enqueue INSERT, req/s (ab -k {label})", "req/s"
    )
    outbox_p99 = Figure(
        SCENARIO, "rest.outbox_p99", f"bare route, postbox's INSERT, p99 (ab {label})", "ms", higher_is_better=False
    )
    ratio_outbox = Figure(SCENARIO, "rest.ratio_outbox", "REST req/s / that route's req/s (paired)", "x")
    cpu_outbox = Figure(
        SCENARIO, "rest.cpu_outbox", "that route's process CPU per request", "µs", higher_is_better=False
    )
    cpu_outbox_pg = Figure(
        SCENARIO, "rest.cpu_outbox_pg", "that route's PostgreSQL backends CPU per request", "µs", higher_is_better=False
    )
    insert = Figure(SCENARIO, "rest.pgbench_insert", f"pgbench one-row INSERT, {clients} clients, {seconds} s", "tx/s")
    outbox_insert = Figure(
        SCENARIO, "rest.pgbench_outbox", f"pgbench postbox's enqueue INSERT, {clients} clients, {seconds} s", "tx/s"
    )
    ratio = Figure(SCENARIO, "rest.ratio", "REST req/s / pgbench INSERT tx/s (paired)", "x", target=Target(">=", 0.3))
    outbox_figures = (outbox_rps, outbox_p99, ratio_outbox, cpu_outbox, cpu_outbox_pg)
    ab_figures = (rps, p50, p99, bare_rps, bare_p99, ratio_bare, cpu_api, cpu_api_pg, cpu_bare, cpu_bare_pg)
    ab_figures += outbox_figures
    figures = [*ab_figures, insert, outbox_insert, ratio]
    have_ab = shutil.which("ab") is not None
    have_pgbench = pgbench.available()
    if not have_ab:
        progress.say(f"rest: {AB_MISSING}; REST figures skipped")
        for figure in (*ab_figures, ratio):
            figure.label += f" [skipped: {AB_MISSING}]"
    if not have_pgbench:
        progress.say(f"rest: {pgbench.MISSING}; pgbench figures skipped")
        for figure in (insert, outbox_insert, ratio):
            figure.label += f" [skipped: {pgbench.MISSING}]"
    key = secrets.token_urlsafe(24)
    port, bare_port, outbox_port = free_port(), free_port(), free_port()
    base, bare_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
    outbox_base = f"http://127.0.0.1:{outbox_port}"
    env = bench_env(database_url, box.redis_url, box.prefix, POSTBOX_API_KEY=key)
    folder = Path(tempfile.mkdtemp(prefix="postbox-bench-rest-"))
    body = folder / "body.json"
    body.write_bytes(orjson.dumps(BODY))
    try:
        with psycopg.connect(database_url) as conn:
            conn.execute(ROWS_DDL)
            conn.execute(bare_api.ROWS_DDL)
            conn.commit()
            outbox.reset(conn)
            with children(env) as kids:
                if have_ab:
                    argv = ["postbox.app", "api", "run", "--host", "127.0.0.1", "--port", str(port)]
                    api = kids.python("api", [*argv, "--tasks", "postbox_bench.tasks"])
                    bare = kids.python("bare", ["postbox_bench.bare_api", "--port", str(bare_port)])
                    bare_outbox = kids.python(
                        "bare-outbox", ["postbox_bench.bare_api", "--port", str(outbox_port), "--outbox"]
                    )
                    for up in (base, bare_base, outbox_base):
                        wait_healthy(up, kids)
                    warm = min(WARMUP_REQUESTS, requests)
                    for up in (base, bare_base, outbox_base):
                        ab(f"{up}/api/v1/jobs", key, body, clients=clients, requests=warm)
                    progress.say("rest: API and bare route up and warmed")
                for rep in range(params.repeat):
                    if have_ab:
                        measured, own, pg = _measured_route(
                            conn, kids, api.pid, API_APP_NAME, f"{base}/api/v1/jobs", outbox.COUNT_UNFINISHED,
                            "the jobs committed were", key, body, clients=clients, requests=requests,
                        )  # fmt: skip
                        for figure, value in zip(
                            (rps, p50, p99, cpu_api, cpu_api_pg), (*measured[:3], own, pg), strict=True
                        ):
                            figure.values.append(value)
                        progress.say(
                            f"rest rep {rep + 1}/{params.repeat}: {measured[0]:,.0f} req/s, "
                            f"p50 {measured[1]:.1f} ms, p99 {measured[2]:.1f} ms, keep-alive requests {measured[3]:,}, "
                            f"CPU/request API {own:,.0f} µs + PostgreSQL {pg:,.0f} µs"
                        )
                        measured, own, pg = _measured_route(
                            conn, kids, bare.pid, BARE_APP_NAME, f"{bare_base}/api/v1/jobs", bare_api.COUNT,
                            "the bare route inserted", key, body, clients=clients, requests=requests,
                        )  # fmt: skip
                        for figure, value in zip(
                            (bare_rps, bare_p99, cpu_bare, cpu_bare_pg),
                            (measured[0], measured[2], own, pg),
                            strict=True,
                        ):
                            figure.values.append(value)
                        ratio_bare.values.append(rps.values[-1] / bare_rps.values[-1])
                        progress.say(
                            f"rest rep {rep + 1}/{params.repeat}: bare route {measured[0]:,.0f} req/s, "
                            f"p99 {measured[2]:.1f} ms, CPU/request {own:,.0f} µs + PostgreSQL {pg:,.0f} µs; "
                            f"REST / bare {ratio_bare.values[-1]:.2f}"
                        )
                        measured, own, pg = _measured_route(
                            conn, kids, bare_outbox.pid, OUTBOX_APP_NAME, f"{outbox_base}/api/v1/jobs",
                            outbox.COUNT_UNFINISHED, "the outbox route inserted", key, body,
                            clients=clients, requests=requests,
                        )  # fmt: skip
                        for figure, value in zip(
                            (outbox_rps, outbox_p99, cpu_outbox, cpu_outbox_pg),
                            (measured[0], measured[2], own, pg),
                            strict=True,
                        ):
                            figure.values.append(value)
                        ratio_outbox.values.append(rps.values[-1] / outbox_rps.values[-1])
                        progress.say(
                            f"rest rep {rep + 1}/{params.repeat}: outbox route {measured[0]:,.0f} req/s, "
                            f"p99 {measured[2]:.1f} ms, CPU/request {own:,.0f} µs + PostgreSQL {pg:,.0f} µs; "
                            f"REST / it {ratio_outbox.values[-1]:.2f}"
                        )
                    if have_pgbench:
                        result = pgbench.run(database_url, INSERT_SCRIPT, clients=clients, seconds=seconds)
                        insert.values.append(result.tps)
                        progress.say(f"rest rep {rep + 1}/{params.repeat}: pgbench INSERT {result.tps:,.0f} tx/s")
                        result = pgbench.run(database_url, outbox_insert_script(), clients=clients, seconds=seconds)
                        outbox_insert.values.append(result.tps)
                        progress.say(
                            f"rest rep {rep + 1}/{params.repeat}: pgbench postbox's INSERT {result.tps:,.0f} tx/s"
                        )
                    if have_ab and have_pgbench:
                        ratio.values.append(rps.values[-1] / insert.values[-1])
            outbox.reset(conn)
            conn.execute("TRUNCATE public.bench_rows")
            conn.execute("DROP TABLE IF EXISTS public.bench_api_rows")
            conn.commit()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    box.clean_redis_prefix()
    return figures
