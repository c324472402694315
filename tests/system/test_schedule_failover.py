"""Periodic jobs on real processes: a 1-second schedule through leader SIGKILLs and SIGSTOPs; code removal.

Two relay processes load ``tests.harness.tasks.periodic`` (``POSTBOX_TASKS``) and sync
its schedules at start. Ten times, four seconds apart, the leader is killed with SIGKILL or
frozen with SIGSTOP past its session timeout (a killed relay
is replaced by a new process, so two always run). Afterwards every occurrence
of ``every-second`` between the first and the last must have exactly one job:
contiguous seconds, no gap, no duplicate.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.fleet import kill
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

SESSION_TIMEOUT = 1  # seconds: a frozen leader loses its lock after this
FAULT_EVERY = 4.0  # seconds between faults (four occurrences run between two)
FAULTS = 10  # five of each kind, one every FAULT_EVERY seconds


class Relays:
    """Relay processes by id; started with ``python -m postbox.relay run``, logs in ``log_dir``."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.count = 0

    def start(self) -> str:
        relay_id = f"relay-s{self.count}"
        self.count += 1
        with open(self.log_dir / f"{relay_id}.log", "wb") as log_file:
            self.procs[relay_id] = subprocess.Popen(
                [sys.executable, "-m", "postbox.relay", "run", "--relay-id", relay_id],
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        return relay_id

    def stop_all(self) -> None:
        kill(self.procs.values())


@contextmanager
def relays(env: dict[str, str], log_dir: Path) -> Iterator[Relays]:
    found = Relays(env, log_dir)
    try:
        yield found
    finally:
        found.stop_all()


def leader(conn: psycopg.Connection[Any]) -> str | None:
    conn.commit()
    row = conn.execute("SELECT id FROM postbox.relays WHERE role = 'leader' ORDER BY term DESC LIMIT 1").fetchone()
    conn.commit()
    return str(row[0]) if row else None


def runs(conn: psycopg.Connection[Any], name: str) -> list[tuple[datetime, int]]:
    conn.commit()
    rows = conn.execute(
        "SELECT occurrence, job_id FROM postbox.schedule_runs WHERE schedule = %s ORDER BY occurrence", (name,)
    ).fetchall()
    conn.commit()
    return [(r[0], r[1]) for r in rows]


def env_for(child_env: dict[str, str], **extra: str) -> dict[str, str]:
    return dict(
        child_env,
        POSTBOX_TASKS="tests.harness.tasks.periodic",
        POSTBOX_RELAY_SESSION_TIMEOUT=str(SESSION_TIMEOUT),
        PYTHONPATH=os.getcwd(),
        **extra,
    )


def test_a_one_second_schedule_through_leader_kills_and_freezes_has_one_job_per_occurrence(
    child_env: dict[str, str], conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    faults: list[str] = []
    with relays(env_for(child_env), tmp_path) as group:
        group.start()
        group.start()
        wait_until(lambda: len(runs(conn, "every-second")) >= 2, 20, message="the schedule fires")
        n = 0
        while n < FAULTS:
            wait_until(lambda: leader(conn) is not None, 15, message="a leader")
            time.sleep(FAULT_EVERY)  # let the schedule run between faults (this is the workload, not a wait)
            current = leader(conn)
            assert current is not None
            proc = group.procs[current]
            if n % 2 == 0:
                proc.kill()
                proc.wait(timeout=10)
                faults.append(f"SIGKILL {current}")
                group.start()  # keep two relays
            else:
                proc.send_signal(signal.SIGSTOP)
                # frozen past its session timeout: the standby must take over meanwhile
                wait_until(lambda current=current: leader(conn) not in (None, current), 15, message="the standby leads")
                proc.send_signal(signal.SIGCONT)
                faults.append(f"SIGSTOP {current}")
            n += 1
        end = datetime.now().astimezone()
        wait_until(lambda: runs(conn, "every-second")[-1][0] >= end, 15, message="the schedule catches up to the end")
    found = runs(conn, "every-second")
    times = [at for at, _ in found]
    first, last = times[0], times[-1]
    expected = [first + timedelta(seconds=s) for s in range(int((last - first).total_seconds()) + 1)]
    print(f"\nfaults: {faults}\noccurrences: {len(times)} from {first} to {last}")
    assert sum(f.startswith("SIGKILL") for f in faults) == FAULTS // 2
    assert sum(f.startswith("SIGSTOP") for f in faults) == FAULTS // 2
    # contiguous, one each
    assert times == expected
    assert len(times) >= FAULTS * FAULT_EVERY
    conn.commit()
    jobs = conn.execute(
        "SELECT id, task, queue, args->>'label', headers->>'schedule' FROM postbox.outbox ORDER BY id"
    ).fetchall()
    conn.commit()
    every_second = [j for j in jobs if j[4] == "every-second"]
    assert sorted(j[0] for j in every_second) == sorted(job for _, job in found)
    assert {(j[1], j[2], j[3]) for j in every_second} == {("tick", "ticks", "second")}


def test_a_schedule_removed_from_the_code_stops_when_a_worker_with_the_new_code_starts(
    child_env: dict[str, str], conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with relays(env_for(child_env), tmp_path) as group:
        group.start()
        wait_until(lambda: len(runs(conn, "doomed")) >= 2, 20, message="both schedules fire")
        with open(tmp_path / "worker.log", "wb") as log_file:
            worker = subprocess.Popen(
                [sys.executable, "-m", "postbox.worker", "run", "--concurrency", "1"],
                env=env_for(child_env, POSTBOX_TEST_SCHEDULES="v2"),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:

            def removed() -> bool:
                conn.commit()
                row = conn.execute("SELECT removed_at FROM postbox.schedules WHERE name = 'doomed'").fetchone()
                conn.commit()
                return row is not None and row[0] is not None

            wait_until(removed, 20, message="the worker's sync removes `doomed`")
            conn.commit()
            removed_at = conn.execute("SELECT removed_at FROM postbox.schedules WHERE name = 'doomed'").fetchone()
            conn.commit()
            assert removed_at is not None
            stopped_with = len(runs(conn, "doomed"))
            before = len(runs(conn, "every-second"))
            wait_until(lambda: len(runs(conn, "every-second")) >= before + 3, 20, message="the other one goes on")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=20)
    doomed = runs(conn, "doomed")
    assert len(doomed) == stopped_with
    assert all(at <= removed_at[0] + timedelta(seconds=1) for at, _ in doomed)  # a tick in flight at the sync
