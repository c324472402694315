"""PostgreSQL restarts (fast and immediate shutdown) under two relays and two busy workers.

A private PostgreSQL server (system binaries, see tests/harness/postgres_server.py)
is restarted twice while a producer keeps enqueueing: first ``pg_ctl -m fast``
(clients are told the server is shutting down), then ``-m immediate`` (a crash:
no goodbye, recovery replays the WAL). Nobody restarts the postbox processes:
each must reconnect on its own, a relay must lead again, and the usual
invariants must hold — every committed job succeeded exactly once, with one
effect, attempts within max_attempts.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from postbox import migrate
from tests import tasks_ha
from tests.harness.postgres_server import PostgresServer, running_postgres

pytestmark = pytest.mark.system

JOBS_PER_SECOND = 50.0


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until ``predicate`` holds (a refused connection counts as "not yet"); return seconds waited."""
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start
        except psycopg.OperationalError:
            pass
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class Producer(threading.Thread):
    """Enqueues one job per transaction at a steady rate; remembers the ids whose COMMIT returned."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.committed: list[int] = []
        self.refused = 0
        self.halt = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        n = 0
        while not self.halt.wait(1 / JOBS_PER_SECOND):  # pacing the load, not waiting for a condition
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, connect_timeout=2)
                row = conn.execute(
                    "SELECT postbox.enqueue('ha_effect', jsonb_build_object('n', %s::int), %s)", (n, tasks_ha.QUEUE)
                ).fetchone()
                conn.commit()
                assert row is not None
                self.committed.append(int(row[0]))
                n += 1
            except psycopg.OperationalError:
                self.refused += 1  # the server is down or restarting: an application would retry too
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


@pytest.fixture
def private_pg() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        url = server.url()
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(tasks_ha.EFFECTS_DDL)
        yield server


def one(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def finished_count(url: str) -> int:
    return int(one(url, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'"))


def leader_count(url: str) -> int:
    """Sessions holding the relay's advisory lock (what leadership is, not what a table says)."""
    return int(one(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"))


@pytest.mark.timeout(240)
def test_postgres_fast_and_immediate_restarts_under_load(
    private_pg: PostgresServer, child_env: dict[str, str], tmp_path: Path
) -> None:
    url = private_pg.url()
    env = dict(
        child_env,
        POSTBOX_DATABASE_URL=url,
        POSTBOX_VISIBILITY_TIMEOUT="3",
        POSTBOX_HEARTBEAT_INTERVAL="0.5",
        POSTBOX_RELAY_SESSION_TIMEOUT="2",
        POSTBOX_DRAIN_TIMEOUT="2",
        POSTBOX_LOG_LEVEL="INFO",
    )
    commands = [
        ["-m", "postbox.relay", "run"],
        ["-m", "postbox.relay", "run"],
        *[["-m", "postbox.worker", "run", "--tasks", "tests.tasks_ha", "--queues", tasks_ha.QUEUE,
           "--concurrency", "4"]] * 2,
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    producer = Producer(url)
    try:
        for n, argv in enumerate(commands):
            logs.append(tmp_path / f"proc-{n}.log")
            with open(logs[-1], "wb") as out:
                procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT))
        producer.start()
        wait_for(lambda: finished_count(url) >= 50, 60, "the first 50 jobs done")
        for mode, down_for in (("fast", 0.0), ("immediate", 0.0), ("immediate", 5.0)):
            before = finished_count(url)
            restarted = time.monotonic()
            private_pg.restart(mode, down_for)
            up = time.monotonic()
            # Progress again: jobs enqueued after the restart are published, run and recorded.
            wait_for(lambda b=before: finished_count(url) >= b + 100, 60, f"progress after the {mode} restart")
            print(f"\n{mode} restart: server down and up in {up - restarted:.2f}s; 100 more jobs done "
                  f"{time.monotonic() - up:.2f}s after it was up")  # fmt: skip
            wait_for(lambda: leader_count(url) == 1, 30, f"one relay leading after the {mode} restart")
        producer.halt.set()
        producer.join(timeout=30)
        assert producer.committed and producer.refused > 0  # the restarts were real: the producer saw them
        total = int(one(url, "SELECT count(*) FROM postbox.outbox"))
        wait_for(lambda: finished_count(url) == total, 90, "every job finished")
        alive = [p.poll() for p in procs]
        assert alive == [None] * len(procs), alive  # nobody was restarted: each one reconnected on its own
        with psycopg.connect(url, autocommit=True) as conn:
            ids = {r[0] for r in conn.execute("SELECT id FROM postbox.outbox WHERE state = 'succeeded'")}
            assert set(producer.committed) <= ids  # every acknowledged commit is a job (others may be too)
            doubled = conn.execute(
                "SELECT job_id, count(*) FROM public.ha_effects GROUP BY 1 HAVING count(*) <> 1"
            ).fetchall()
            assert doubled == []
            effects = {r[0] for r in conn.execute("SELECT job_id FROM public.ha_effects")}
            assert effects == ids
            over = conn.execute("SELECT count(*) FROM postbox.outbox WHERE attempts > max_attempts").fetchone()
            assert over == (0,)
            assert leader_count(url) == 1
    except BaseException:
        for log in logs:
            print(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        raise
    finally:
        producer.halt.set()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
