"""``postbox worker run`` / ``python -m worker run`` as processes: bad input, metrics, SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg
import pytest

import jobs
from tests import tasks_worker as t

pytestmark = pytest.mark.system


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60)


def test_missing_database_url_fails_fast_naming_it(child_env: dict[str, str]) -> None:
    env = {k: v for k, v in child_env.items() if k != "POSTBOX_DATABASE_URL"}
    done = run(["-m", "worker", "run", "--tasks", "tests.tasks_worker"], env)
    assert done.returncode == 2
    assert "POSTBOX_DATABASE_URL" in done.stderr


def test_bad_flags_fail_fast_naming_the_setting(child_env: dict[str, str]) -> None:
    done = run(["-m", "app", "worker", "run", "--tasks", "tests.tasks_worker", "--concurrency", "0"], child_env)
    assert done.returncode == 2 and "POSTBOX_CONCURRENCY" in done.stderr
    done = run(["-m", "worker", "run", "--tasks", "tests.no_such_tasks"], child_env)
    assert done.returncode == 2 and "POSTBOX_TASKS" in done.stderr
    done = run(["-m", "worker", "run", "--queues", "Bad Name"], child_env)
    assert done.returncode == 2 and "POSTBOX_QUEUES" in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_worker_process_serves_metrics_and_stops_on_sigint(child_env: dict[str, str], database_url: str) -> None:
    port = _free_port()
    env = {**child_env, "POSTBOX_WORKER_METRICS_PORT": str(port), "POSTBOX_TASKS": "tests.tasks_worker"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "worker", "run", "--queues", t.QUEUE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            deadline = time.monotonic() + 20
            row: Any = None
            while row is None and time.monotonic() < deadline:
                row = conn.execute("SELECT id FROM workers WHERE pid = %s", (proc.pid,)).fetchone()
                time.sleep(0.05)
            assert row is not None, "worker did not register"
            assert row[0].startswith("worker-") and len(row[0]) == 15
            jobs.enqueue(conn, t.w_noop)

            relay = subprocess.Popen([sys.executable, "-m", "relay", "run"], env=env, stderr=subprocess.DEVNULL)
            try:
                while time.monotonic() < deadline + 20:
                    if conn.execute("SELECT state FROM outbox").fetchone() == ("succeeded",):
                        break
                    time.sleep(0.05)
            finally:
                relay.kill()
                relay.wait(10)
            body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            assert f'postbox_worker_jobs_total{{outcome="succeeded",queue="{t.QUEUE}",task="w_noop"}} 1.0' in body
            assert "postbox_worker_in_flight 0.0" in body
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
