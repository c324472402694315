"""Fair queues on real processes (issue 32, item 1): the relay process and worker processes.

Tenant A's backlog waits in a fair queue; tenant B's jobs, enqueued later, run
before most of A's backlog, not after it. With a worker SIGKILLed and Redis
flushed mid-run, every job still runs its effect once and the window is never
exceeded (its accounting lives in PostgreSQL). Assertions are on order and
counts, not on times, so a loaded machine does not fail them.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from postbox import fairness
from tests.harness.fleet import Fleet, one, worker_id_of
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401 - fixture
from tests.harness.tasks import fair as f
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.system]

WINDOW = 12


def fair_fleet(env: dict[str, str], log_dir: Path) -> Fleet:
    """Relay and workers (8 jobs at once each) on the fair queue."""
    return Fleet(env, log_dir, tasks="tests.harness.tasks.fair", queue=f.QUEUE, concurrency=8)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f.RUNS_DDL)
        fairness.declare(conn, f.QUEUE, by="tenant_id", window=WINDOW)
        yield conn


def enqueue(db: psycopg.Connection[Any], tenant: str, n: int, seconds: float) -> list[int]:
    return postbox.enqueue_many(
        db, [{"task": "fair_job", "args": {"tenant_id": tenant, "seconds": seconds}} for _ in range(n)]
    )


class InFlight:
    """Samples the fair queue's published, unfinished jobs on a connection of its own until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                n = one(
                    conn,
                    "SELECT count(*) FROM postbox.outbox WHERE queue = %s AND state IN ('queued', 'running')",
                    (f.QUEUE,),
                )
                self.peak = max(self.peak, int(n))
                self.samples += 1
                self._stop.wait(0.01)

    def __enter__(self) -> InFlight:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def a_started_after_b(db: psycopg.Connection[Any]) -> int:
    """A's runs that started after B's last run started."""
    return int(
        one(
            db,
            "SELECT count(*) FROM fair_runs WHERE tenant_id = 'a'"
            " AND started > (SELECT max(started) FROM fair_runs WHERE tenant_id = 'b')",
        )
    )


def test_a_late_tenant_runs_before_the_backlog_of_another(
    child_env: dict[str, str], tmp_path: Path, db: psycopg.Connection[Any], database_url: str
) -> None:
    fleet = fair_fleet(child_env, tmp_path)
    try:
        a = enqueue(db, "a", 600, 0.01)
        fleet.relay()
        procs = [fleet.worker() for _ in range(2)]
        wait_until(lambda: all(worker_id_of(db, p) for p in procs), 30, message=lambda: f"workers\n{fleet.logs()}")
        with InFlight(database_url) as window:
            wait_until(lambda: one(db, "SELECT count(*) FROM fair_runs") >= 50, 60, message=lambda: fleet.logs())
            b = enqueue(db, "b", 20, 0.01)
            wait_until(
                lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE finished_at IS NULL") == 0,
                120,
                message=lambda: f"every job finished\n{fleet.logs()}",
            )
    finally:
        fleet.close()
    assert one(db, "SELECT count(*) FROM fair_runs") == len(a) + len(b)
    # B's 20 were all started while most of A's backlog still waited: without fairness they
    # would start after all of it (0 of A after them)
    assert a_started_after_b(db) >= 400
    assert 0 < window.peak <= WINDOW and window.samples > 10


def test_a_sigkilled_worker_and_a_redis_flush_lose_nothing_and_run_nothing_twice(
    child_env: dict[str, str],
    tmp_path: Path,
    db: psycopg.Connection[Any],
    database_url: str,
    private_redis: RedisServer,  # noqa: F811
) -> None:
    fleet = fair_fleet(dict(child_env, POSTBOX_REDIS_URL=private_redis.url), tmp_path)
    try:
        a = enqueue(db, "a", 300, 0.05)
        fleet.relay()
        victim = fleet.worker()
        survivor = fleet.worker()
        wait_until(lambda: worker_id_of(db, victim) and worker_id_of(db, survivor), 30, message=lambda: fleet.logs())
        with InFlight(database_url) as window:
            wait_until(lambda: one(db, "SELECT count(*) FROM fair_runs") >= 30, 60, message=lambda: fleet.logs())
            b = enqueue(db, "b", 20, 0.05)
            victim.send_signal(signal.SIGKILL)  # mid-job: its runs are reclaimed after the visibility timeout
            victim.wait(10)
            wait_until(lambda: one(db, "SELECT count(*) FROM fair_runs") >= 80, 60, message=lambda: fleet.logs())
            private_redis.client().flushall()  # the window's jobs are republished; its count is PostgreSQL's
            flushed = time.monotonic()
            wait_until(
                lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE finished_at IS NULL") == 0,
                180,
                message=lambda: f"every job finished after the faults\n{fleet.logs()}",
            )
        took = time.monotonic() - flushed
    finally:
        fleet.close()
    relay_log = "".join(p.read_text(errors="replace") for p in tmp_path.glob("relay-*.log"))
    assert "Redis lost data" in relay_log
    total = len(a) + len(b)
    assert one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == total
    assert one(db, "SELECT count(DISTINCT job_id) FROM fair_runs") == total
    assert one(db, "SELECT count(*) FROM fair_runs") == total  # no effect twice
    assert window.peak <= WINDOW
    assert took < 180
