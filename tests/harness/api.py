"""Shared pieces of the API and admin CLI tests: the app on the test's servers, SQL shortcuts."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

import tests.harness.tasks.api  # noqa: F401  (registers the api_* tasks)
from postbox.app.api.main import create_app
from postbox.registry import default_registry
from postbox.settings import Settings

API_KEY = "s3cret-key"


def make_client(settings: Settings, **overrides: Any) -> TestClient:
    """The API on the test's servers: a development API (no key, insecure mode) unless ``overrides`` say otherwise."""
    app = create_app(settings.model_copy(update={"api_insecure": True, **overrides}), registry=default_registry)
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture(name="client")
def client_fixture(settings: Settings) -> Iterator[TestClient]:
    with make_client(settings) as c:
        yield c


@pytest.fixture(name="keyed_client")
def keyed_client_fixture(settings: Settings) -> Iterator[TestClient]:
    with make_client(settings, api_key=API_KEY) as c:
        yield c


def insert_job(conn: psycopg.Connection[Any], task: str = "api_echo", queue: str = "apiq", **cols: Any) -> int:
    """A job row straight in SQL (state etc. as given)."""
    values = {"task": task, "queue": queue, "args": "{}", **cols}
    names = list(values)
    query = "INSERT INTO postbox.outbox ({}) VALUES ({}) RETURNING id".format(
        ", ".join(names), ", ".join(f"%({n})s" for n in names)
    )
    row = conn.execute(query, values).fetchone()  # type: ignore[arg-type]
    conn.commit()
    assert row is not None
    return int(row[0])


def make_dead(conn: psycopg.Connection[Any], job_id: int, attempts: int = 2, error: str = "boom") -> None:
    """Simulate a worker running a job to death: attempt rows, then state dead."""
    for attempt in range(1, attempts + 1):
        conn.execute(
            "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, finished_at, outcome, error_class, error)"
            " VALUES (%s, %s, 'worker-deadbeef', now(), %s, 'PermanentError', %s)",
            (job_id, attempt, "dead" if attempt == attempts else "retry", error),
        )
    conn.execute(
        "UPDATE postbox.outbox SET state = 'dead', attempts = %s, finished_at = now(), published_at = now(),"
        " last_error_class = 'PermanentError', last_error = %s WHERE id = %s",
        (attempts, error, job_id),
    )
    conn.commit()


def audit_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    rows = conn.execute("SELECT actor, action, target, request_id FROM postbox.audit_log ORDER BY id").fetchall()
    conn.commit()
    return rows


def job_state(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)).fetchone()
    conn.commit()
    assert row is not None
    return str(row[0])


class Fleet:
    """A real relay and worker process on the test's database and Redis prefix (killed at the end)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = {**env, "POSTBOX_TASKS": "tests.harness.tasks.api", "POSTBOX_HEARTBEAT_INTERVAL": "1"}
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *argv: str, name: str) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.procs.append(
                subprocess.Popen([sys.executable, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT)
            )

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.log_dir.glob("*.log")))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def running_fleet(child_env: dict[str, str], log_dir: Path) -> Iterator[Fleet]:
    fleet = Fleet(child_env, log_dir)
    try:
        fleet.start("-m", "postbox.relay", "run", name="relay")
        fleet.start("-m", "postbox.worker", "run", "--queues", "apiq", "--concurrency", "2", name="worker")
        yield fleet
    finally:
        fleet.close()
