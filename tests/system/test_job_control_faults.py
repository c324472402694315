"""Snooze and progress under a worker SIGKILL (issue 32): nothing lost, nothing run twice.

Real relay and worker processes (``python -m postbox.relay run`` / ``postbox.worker``),
a 2 s visibility timeout; processes are killed in teardown whatever happens.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


class Fleet:
    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = {
            **env,
            "POSTBOX_VISIBILITY_TIMEOUT": "2.0",
            "POSTBOX_HEARTBEAT_INTERVAL": "0.5",
            "POSTBOX_RETRY_BASE_DELAY": "0.05",
            "POSTBOX_RETRY_MAX_DELAY": "0.2",
        }
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._files: list[Any] = []

    def start(self, *argv: str, name: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}-{len(self.procs)}.log", "wb")
        self._files.append(log)
        proc = subprocess.Popen([sys.executable, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def relay(self) -> subprocess.Popen[bytes]:
        return self.start("-m", "postbox.relay", "run", name="relay")

    def worker(self) -> subprocess.Popen[bytes]:
        return self.start(
            "-m", "postbox.worker", "run", "--tasks", "tests.harness.tasks.worker", "--queues", t.QUEUE, name="worker"
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=10)
        for log in self._files:
            log.close()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.log_dir.glob("*.log")))


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    procs = Fleet(child_env, tmp_path)
    try:
        yield procs
    finally:
        procs.close()


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(t.EFFECTS_DDL)
        yield conn


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def test_a_worker_killed_while_its_job_is_snoozed_loses_nothing_and_the_job_runs_once(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """The snooze is a row in PostgreSQL (retrying, due later): the worker that recorded it may die."""
    fleet.relay()
    first = fleet.worker()
    job_id = postbox.enqueue(db, t.w_snooze, {"times": 1, "seconds": 2.0})
    wait_until(
        lambda: one(db, "SELECT outcome FROM postbox.job_attempts WHERE outbox_id = %s", (job_id,)) == "snoozed",
        30,
        message=lambda: f"snoozed\n{fleet.logs()}",
    )
    first.kill()
    first.wait(10)
    fleet.worker()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)) == "succeeded",
        30,
        message=lambda: f"ran after the snooze\n{fleet.logs()}",
    )
    assert db.execute("SELECT attempt, outcome FROM postbox.job_attempts ORDER BY attempt").fetchall() == [
        (1, "snoozed"),
        (2, "succeeded"),
    ]
    assert db.execute("SELECT attempts, max_attempts FROM postbox.outbox").fetchall() == [(2, 3)]
    assert db.execute("SELECT job_id, label FROM worker_effects").fetchall() == [(job_id, "snooze")]


def test_a_worker_killed_mid_run_the_takeover_reports_progress_as_its_own_attempt(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """Progress written by the killed run stays (attempt 1) until the takeover's first report replaces it; the
    takeover's last value is written before its success; the job succeeds once."""
    fleet.relay()
    first = fleet.worker()
    job_id = postbox.enqueue(db, t.w_progress, {"steps": 400, "pause": 0.01})
    wait_until(
        lambda: one(db, "SELECT progress->>'attempt' FROM postbox.outbox WHERE id = %s", (job_id,)) == "1",
        30,
        message=lambda: f"first run's progress\n{fleet.logs()}",
    )
    first.kill()
    first.wait(10)
    killed_at = one(db, "SELECT (progress->>'done')::int FROM postbox.outbox WHERE id = %s", (job_id,))
    assert killed_at is not None and killed_at < 400
    fleet.worker()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)) == "succeeded",
        40,
        message=lambda: f"takeover\n{fleet.logs()}",
    )
    progress = one(db, "SELECT progress FROM postbox.outbox WHERE id = %s", (job_id,))
    assert (progress["done"], progress["total"], progress["note"], progress["attempt"]) == (400, 400, "step 400", 2)
    assert db.execute("SELECT attempt, outcome FROM postbox.job_attempts ORDER BY attempt").fetchall() == [
        (1, "lost"),
        (2, "succeeded"),
    ]
