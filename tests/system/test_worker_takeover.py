"""Issue 14 on real processes: takeover under a backlog, stuck sync handlers, shutdown bounds.

A worker that dies (SIGKILL) or freezes (SIGSTOP) while a backlog keeps every
other worker busy: its in-flight jobs are taken over within the visibility
timeout plus a small bound, not when a slot happens to be free.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.fleet import VISIBILITY, Fleet, one, worker_id_of
from tests.harness.tasks import hardening as h
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.system, pytest.mark.alone]  # take-over and drain times

TASKS = "tests.harness.tasks.worker,tests.harness.tasks.hardening"
# Lease and idle time are refreshed every min(heartbeat, visibility / 3) = 0.5 s and
# the reclaimer looks every visibility / 4 = 0.5 s: a takeover is due by visibility
# + 1 s; the rest is slack for a busy machine.
TAKEOVER_BOUND = VISIBILITY + 2.0
MEASURED: dict[str, list[float]] = {}


class HardeningFleet(Fleet):
    """Workers with the hardening tasks as well as the worker tests' ones."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        super().__init__(env, log_dir, tasks=TASKS)


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path) -> Iterator[HardeningFleet]:
    with HardeningFleet(child_env, tmp_path) as procs:
        yield procs


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_lost_workers_jobs_are_taken_over_within_the_bound_whatever_the_backlog(
    fleet: HardeningFleet, db: psycopg.Connection[Any], fault: str
) -> None:
    fleet.relay()
    victim = fleet.worker(concurrency=3)
    busy = fleet.worker(concurrency=3)
    wait_until(
        lambda: worker_id_of(db, victim) and worker_id_of(db, busy),
        20,
        message=lambda: f"workers up\n{fleet.logs()}",
    )
    victim_id = worker_id_of(db, victim)
    # A backlog far longer than the test: every slot of the live worker stays busy.
    postbox.enqueue_many(db, [{"task": "h_sync_sleep", "args": {"seconds": 1.0}} for _ in range(200)])
    mine = "SELECT array_agg(id ORDER BY id) FROM postbox.outbox WHERE state = 'running' AND claimed_by = %s"
    wait_until(
        lambda: len(one(db, mine, (victim_id,)) or []) == 3,
        20,
        message=lambda: f"victim running three jobs\n{fleet.logs()}",
    )
    victim.send_signal(signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
    taken: list[int] = one(db, mine, (victim_id,))
    struck = one(db, "SELECT now()")
    if fault == "SIGKILL":
        victim.wait(10)
    retaken = (
        "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND started_at > %s"
        " AND (state <> 'running' OR claimed_by <> %s)"
    )
    wait_until(
        lambda: one(db, retaken, (taken, struck, victim_id)) == 3, 30, message=lambda: f"takeover\n{fleet.logs()}"
    )
    delays = [
        row[0]
        for row in db.execute(
            "SELECT extract(epoch FROM started_at - %s)::float8 FROM postbox.outbox WHERE id = ANY(%s) ORDER BY id",
            (struck, taken),
        ).fetchall()
    ]
    MEASURED[fault] = delays
    print(f"takeover after {fault} under a backlog (visibility {VISIBILITY} s): {delays}")
    assert all(VISIBILITY - 0.6 <= d <= TAKEOVER_BOUND for d in delays), delays
    assert one(db, "SELECT count(*) FROM postbox.outbox WHERE state IN ('succeeded', 'running')") >= 3
    if fault == "SIGSTOP":
        victim.send_signal(signal.SIGCONT)


def test_sigterm_ends_a_worker_with_a_stuck_sync_handler_within_the_drain_timeout(
    fleet: HardeningFleet, db: psycopg.Connection[Any]
) -> None:
    fleet.relay()
    proc = fleet.worker(POSTBOX_DRAIN_TIMEOUT="1")
    wait_until(lambda: worker_id_of(db, proc), 20, message=lambda: f"worker up\n{fleet.logs()}")
    postbox.enqueue(db, h.h_sync_stuck)
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "running",
        20,
        message=lambda: f"job running\n{fleet.logs()}",
    )
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    assert proc.wait(15) == 0
    took = time.monotonic() - sent
    assert took < 1 + 6, took  # the drain timeout, then outcomes, registry row, connections (busy machine: generous)
    assert one(db, "SELECT state FROM postbox.outbox") == "running"  # left for another worker


def test_a_second_sigterm_ends_a_worker_with_a_stuck_sync_handler_at_once(
    fleet: HardeningFleet, db: psycopg.Connection[Any]
) -> None:
    fleet.relay()
    proc = fleet.worker(POSTBOX_DRAIN_TIMEOUT="60")
    wait_until(lambda: worker_id_of(db, proc), 20, message=lambda: f"worker up\n{fleet.logs()}")
    postbox.enqueue(db, h.h_sync_stuck)
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "running",
        20,
        message=lambda: f"job running\n{fleet.logs()}",
    )
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining" in fleet.logs(), 10, message=lambda: f"drain started\n{fleet.logs()}")
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    # 0: it closed its connections in time; 3: the watchdog ended it (ABORT_GRACE), as promised
    assert proc.wait(15) in (0, 3)
    assert time.monotonic() - sent < 6  # not the 60 s drain timeout
