"""Issue 14's fault mix on real processes, during a backlog, and the invariants after it.

Two relays, three workers (a process manager restarts what dies) and a private
Redis. While 300 half-second jobs are being worked off: a worker is SIGKILLed,
another SIGSTOPped past the visibility timeout, the leading relay SIGKILLed,
Redis flushed and then restarted empty, the workers' PostgreSQL sessions
terminated; a poison job (``os._exit``) and jobs with unencodable text run
among them. Afterwards: no job lost, no effect twice, nothing running, no
attempts over the limit, every takeover within its bound, and the relays and
workers tables true about who died.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.fleet import VISIBILITY, one, worker_id_of
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401 - fixture
from tests.harness.tasks import hardening as h
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until
from tests.system.test_worker_takeover import TAKEOVER_BOUND, HardeningFleet

pytestmark = pytest.mark.system

JOBS = 300
JOB_SECONDS = 0.5


class Supervised:
    """The fleet under a process manager: a worker that dies is replaced."""

    def __init__(self, fleet: HardeningFleet, db: psycopg.Connection[Any]) -> None:
        self.fleet = fleet
        self.db = db
        self.workers = [fleet.worker(concurrency=4) for _ in range(3)]
        self.relays = [fleet.relay(), fleet.relay()]
        self.crashes = 0  # workers that died on their own (the poison job)
        self.expected_dead: set[int] = set()  # pids killed by the test

    def tend(self) -> None:
        for i, proc in enumerate(self.workers):
            if proc.poll() is not None:
                if proc.pid not in self.expected_dead:
                    assert proc.returncode == 1, proc.returncode  # os._exit(1) of the poison
                    self.crashes += 1
                self.workers[i] = self.fleet.worker(concurrency=4)

    def wait(self, predicate: Callable[[], Any], within: float, what: str) -> None:
        """Until ``predicate`` holds, replacing crashed workers between looks."""

        def tended() -> Any:
            self.tend()
            return predicate()

        wait_until(tended, within, message=lambda: f"{what}\n{self.fleet.logs()}")

    def busy_worker(self, exclude: subprocess.Popen[bytes] | None = None) -> subprocess.Popen[bytes]:
        """A registered worker running at least two jobs now."""
        found: list[subprocess.Popen[bytes]] = []

        def pick() -> bool:
            for proc in self.workers:
                wid = worker_id_of(self.db, proc) if proc is not exclude and proc.poll() is None else None
                running = "SELECT count(*) FROM postbox.outbox WHERE state = 'running' AND claimed_by = %s"
                if wid and one(self.db, running, (wid,)) >= 2:
                    found.append(proc)
                    return True
            return False

        self.wait(pick, 30, "a busy worker")
        return found[0]


def running_of(db: psycopg.Connection[Any], worker_id: str) -> list[int]:
    rows = db.execute(
        "SELECT id FROM postbox.outbox WHERE state = 'running' AND claimed_by = %s ORDER BY id", (worker_id,)
    ).fetchall()
    return [r[0] for r in rows]


def takeover_delays(db: psycopg.Connection[Any], ids: list[int], struck: Any, gone: str) -> list[float] | None:
    """Seconds from the fault to each job's new claim; None while one is still held by ``gone``."""
    rows = db.execute(
        "SELECT extract(epoch FROM started_at - %s)::float8, claimed_by, state FROM postbox.outbox"
        " WHERE id = ANY(%s) ORDER BY id",
        (struck, ids),
    ).fetchall()
    if any(state == "running" and worker == gone for _, worker, state in rows):
        return None
    return [delay for delay, _, _ in rows]


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path, private_redis: RedisServer) -> Iterator[HardeningFleet]:  # noqa: F811
    procs = HardeningFleet(dict(child_env, POSTBOX_REDIS_URL=private_redis.url), tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def test_the_fault_mix_loses_nothing_doubles_nothing_and_takes_over_in_time(
    fleet: HardeningFleet,
    database_url: str,
    private_redis: RedisServer,  # noqa: F811
) -> None:
    db = psycopg.connect(database_url, autocommit=True)
    db.execute(t.EFFECTS_DDL)
    cluster = Supervised(fleet, db)
    cluster.wait(lambda: all(worker_id_of(db, w) for w in cluster.workers), 30, "workers up")
    work = postbox.enqueue_many(
        db, [{"task": "w_slow_effect", "args": {"seconds": JOB_SECONDS, "label": "mix"}} for _ in range(JOBS)]
    )
    poison = postbox.enqueue(db, h.h_exit)
    surrogate = postbox.enqueue(db, h.h_surrogate_error_last)
    kept = postbox.enqueue(db, h.h_surrogate_result)
    done = "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND state = 'succeeded'"
    cluster.wait(lambda: one(db, done, (work,)) >= 20, 30, "the backlog under way")

    # 1. SIGKILL a busy worker.
    killed = cluster.busy_worker()
    killed_id = worker_id_of(db, killed)
    assert killed_id is not None
    cluster.expected_dead.add(killed.pid)
    killed.kill()
    killed.wait(10)
    struck_kill = one(db, "SELECT now()")
    lost_to_kill = running_of(db, killed_id)

    # 2. SIGSTOP another busy worker past the visibility timeout.
    stopped = cluster.busy_worker(exclude=killed)
    stopped_id = worker_id_of(db, stopped)
    assert stopped_id is not None
    stopped.send_signal(signal.SIGSTOP)
    struck_stop = one(db, "SELECT now()")
    time_stopped = time.monotonic()
    lost_to_stop = running_of(db, stopped_id)

    delays: dict[str, list[float]] = {}

    def taken_over(name: str, ids: list[int], struck: Any, gone: str) -> bool:
        found = takeover_delays(db, ids, struck, gone)
        if found is not None:
            delays[name] = found
        return found is not None

    cluster.wait(lambda: taken_over("SIGKILL", lost_to_kill, struck_kill, killed_id), 30, "SIGKILL takeover")
    cluster.wait(lambda: taken_over("SIGSTOP", lost_to_stop, struck_stop, stopped_id), 30, "SIGSTOP takeover")
    print(f"\ntakeovers under the backlog (visibility {VISIBILITY} s): {delays}")
    assert lost_to_kill and lost_to_stop
    assert all(d <= TAKEOVER_BOUND for d in delays["SIGKILL"] + delays["SIGSTOP"]), delays

    # 3. SIGKILL the leading relay; a replacement starts.
    leader_pid = one(db, "SELECT pid FROM postbox.relays WHERE role = 'leader'")
    leader = next(p for p in cluster.relays if p.pid == leader_pid)
    leader.kill()
    leader.wait(10)
    killed_leader = time.monotonic()
    cluster.relays.append(fleet.relay())
    new_leader = "SELECT count(*) FROM postbox.relays WHERE role = 'leader' AND pid <> %s"
    cluster.wait(lambda: one(db, new_leader, (leader_pid,)) == 1, 30, "a new leader")
    costs = {"leader SIGKILL -> new leader": time.monotonic() - killed_leader}
    claimed_since = "SELECT count(*) FROM postbox.outbox WHERE started_at > %s"

    def progress_after(fault: str, started: float) -> None:
        """Seconds from ``fault`` to the next claim (a job started after it)."""
        at = one(db, "SELECT now()")
        cluster.wait(lambda: one(db, claimed_since, (at,)) > 0, 30, f"a claim after {fault}")
        costs[f"{fault} -> next claim"] = time.monotonic() - started

    # 4. Redis loses everything (FLUSHALL), later restarts empty.
    client = private_redis.client()
    try:
        client.flushall()
    finally:
        client.close()
    progress_after("FLUSHALL", time.monotonic())

    # 5. The workers' PostgreSQL sessions are terminated.
    ended = db.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'postbox-worker-%'"
    ).fetchone()
    assert ended is not None and ended[0] > 0
    progress_after("pg_terminate_backend of the workers' sessions", time.monotonic())

    cluster.wait(lambda: time.monotonic() - time_stopped >= 2 * VISIBILITY, 30, "twice the visibility timeout")
    stopped.send_signal(signal.SIGCONT)
    private_redis.restart()
    progress_after("Redis restart (empty)", time.monotonic())
    print(f"what each fault cost: { {k: round(v, 2) for k, v in costs.items()} }")

    # After the last fault: everything ends.
    finished = "SELECT count(*) FROM postbox.outbox WHERE state IN ('succeeded', 'dead', 'cancelled', 'expired')"
    cluster.wait(lambda: one(db, finished) == JOBS + 3, 90, "every job finished")

    # No job lost, no effect twice.
    assert one(db, done, (work,)) == JOBS
    effects = db.execute("SELECT job_id, count(*) FROM worker_effects GROUP BY 1").fetchall()
    assert sorted(effects) == [(job_id, 1) for job_id in sorted(work)]
    # Nothing running past its lease, nothing over its attempts.
    assert one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'running'") == 0
    # (A run interrupted among others is counted in attempts, recorded lost/Interrupted, not charged.)
    charged = (
        "SELECT o.state, o.attempts - (SELECT count(*) FROM postbox.job_attempts a WHERE a.outbox_id = o.id"
        " AND a.outcome = 'lost' AND a.error_class = 'Interrupted') AS charged, o.max_attempts FROM postbox.outbox o"
    )
    assert one(db, f"SELECT count(*) FROM ({charged}) c WHERE charged > max_attempts") == 0
    # The poison: dead after its own crashes; the text jobs: recorded in a safe form.
    assert db.execute(f"SELECT state, charged FROM ({charged} WHERE o.id = %s) c", (poison,)).fetchall() == [
        ("dead", 3)
    ]
    assert cluster.crashes >= 2  # its own crashes (a test kill may end one of its runs first)
    # One charged attempt; runs of it interrupted by the test's kills (recorded lost, not charged)
    # each add one to the run's budget, so the count in the message is 1 + those runs.
    [(state, last_error)] = db.execute(
        "SELECT state, last_error FROM postbox.outbox WHERE id = %s", (surrogate,)
    ).fetchall()
    assert state == "dead"
    assert re.fullmatch(
        r"attempts exhausted \((\d+)/\1\): \[Errno 2\] No such file or directory : 'report-\\udcff\.pdf'", last_error
    ), last_error
    assert one(db, "SELECT result->>'name' FROM postbox.outbox WHERE id = %s", (kept,)) == "report-\\udcff.pdf"
    # The registries tell the truth about who died.
    relay_role = "SELECT role FROM postbox.relays WHERE pid = %s"
    cluster.wait(lambda: one(db, relay_role, (leader_pid,)) == "stopped", 15, "the killed leader recorded stopped")
    worker_gone = "SELECT stopped_at IS NOT NULL FROM postbox.workers WHERE id = %s"
    cluster.wait(lambda: one(db, worker_gone, (killed_id,)), 15, "the killed worker recorded stopped")
    db.close()
