"""Flow control under a stalled peer and under limits changed at run time (issue 29 items 2-4), on real processes.

- A worker SIGSTOPped *inside* its limited claim (the test signal
  ``POSTBOX_TEST_PAUSE_IN_CLAIM``, ``postbox.worker.flow.PauseInClaim``, makes the
  freeze land there every time) holds its keys' locks: the claim's own
  idle-in-transaction bound cuts it off, and the other workers go on.
- A limit raised or cleared wakes the jobs parked on it within the reload (1 s),
  not at their recheck; a limit lowered is obeyed by the next claim.
- A worker resumed from SIGSTOP decides under the limits committed while it was
  stopped, not under its cached copy.

Measured times are printed (``pytest -s``) and merged into ``$POSTBOX_FLOW_REPORT``.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.fleet import one, worker_id_of
from tests.harness.tasks import flow as f
from tests.harness.wait import wait_until
from tests.system.test_flow_processes import FlowFleet, done, enqueue, make_fleet, report, runs_of

pytestmark = [pytest.mark.system, pytest.mark.alone]

RUNNING = (
    "SELECT count(*) FROM postbox.outbox WHERE task = %s AND state = 'running' AND lease_until > clock_timestamp()"
)
PARKED = "SELECT count(*) FROM postbox.outbox WHERE task = %s AND state = 'pending' AND flow_wait IS NOT NULL"


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f.RUNS_DDL)
        yield conn


def db_now(conn: psycopg.Connection[Any]) -> float:
    return float(one(conn, "SELECT extract(epoch FROM clock_timestamp())::float8"))


def limits_cli(fleet: FlowFleet, *argv: str) -> float:
    """Run ``postbox limits ...`` as its own process; returns the change's time (the row's ``override_at``)."""
    done_ = subprocess.run(
        [sys.executable, "-m", "postbox.app", "limits", *argv, "--json"],
        env=fleet.env,
        capture_output=True,
        timeout=60,
    )
    assert done_.returncode == 0, done_.stderr.decode()
    with psycopg.connect(fleet.env["POSTBOX_DATABASE_URL"], autocommit=True) as conn:
        return float(
            one(
                conn,
                "SELECT extract(epoch FROM override_at)::float8 FROM postbox.limits WHERE scope = %s AND name = %s",
                (argv[1], argv[2]),
            )
        )


def test_a_worker_frozen_inside_its_limited_claim_does_not_block_the_limit_for_the_others(
    child_env: dict[str, str], tmp_path: Path, db: psycopg.Connection[Any]
) -> None:
    visibility = 2.0  # the claim's idle bound: a quarter of it, at least 1 s (postbox.db.claim_bounds)
    marker = tmp_path / "paused-in-claim"
    with make_fleet(child_env, tmp_path, visibility=visibility) as fleet:
        fleet.relay()
        victim = fleet.worker(POSTBOX_TEST_PAUSE_IN_CLAIM=str(marker))
        wait_until(lambda: worker_id_of(db, victim), 30, message=lambda: f"victim up\n{fleet.logs()}")
        first = enqueue(db, "f_conc", [{"seconds": 0.05}])
        wait_until(marker.exists, 30, message=lambda: f"victim paused inside its claim\n{fleet.logs()}")
        assert marker.read_text() == str(victim.pid)
        paused_at = marker.stat().st_mtime  # the claim is idle inside its transaction from here
        # Inside the claim: the key's advisory lock is held by the victim's session.
        holders = (
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = %s"
        )
        assert one(db, holders, (f"postbox-{worker_id_of(db, victim)}",)) >= 1
        fleet.workers(db, 2)  # up and idle: nothing for them yet
        victim.send_signal(signal.SIGSTOP)
        try:
            enqueued_at = db_now(db)
            ids = enqueue(db, "f_conc", [{"seconds": 0.05} for _ in range(30)])
            wait_until(
                lambda: one(db, "SELECT count(*) FROM flow_runs WHERE job_id = ANY(%s)", (ids,)) >= 10,
                30,
                message=lambda: f"the others start jobs of the key while the victim is frozen\n{fleet.logs()}",
            )
            first_start = float(
                one(
                    db,
                    "SELECT extract(epoch FROM min(started_at))::float8 FROM postbox.outbox WHERE id = ANY(%s)",
                    (ids,),
                )
            )
            still_stopped = victim.poll() is None
        finally:
            marker.unlink(missing_ok=True)
            victim.send_signal(signal.SIGCONT)
        waited = first_start - max(enqueued_at, paused_at + 1.0)  # past the claim's idle bound (1 s)
        all_ids = first + ids
        wait_until(lambda: done(db, "f_conc") == len(all_ids), 60, message=lambda: f"all jobs done\n{fleet.logs()}")
        runs = runs_of(db, "f_conc")
        report(
            "frozen_in_claim",
            visibility_s=visibility,
            first_start_past_bound_s=round(waited, 2),
            first_start_after_pause_s=round(first_start - paused_at, 2),
            jobs=len(all_ids),
            max_overlap=f.max_overlap(runs),
        )
        assert still_stopped
        # Cut off after the claim's idle bound (1 s here, counted from the pause, which came
        # before the SIGSTOP), then the relay's publish and a claim's path on a busy box.
        assert waited <= 3.0, waited
        assert len(runs) == len(all_ids)
        assert one(db, "SELECT count(DISTINCT job_id) FROM flow_runs") == len(all_ids)  # nothing ran twice
        assert f.max_overlap(runs) <= 3
        assert one(db, "SELECT array_agg(DISTINCT attempts) FROM postbox.outbox") == [1]


def test_raising_clearing_and_lowering_a_limit_take_effect_within_a_second_or_two(
    child_env: dict[str, str], tmp_path: Path, db: psycopg.Connection[Any]
) -> None:
    # A long visibility timeout: parked jobs' rechecks (>= 10 s) cannot be what wakes them.
    visibility = 10.0
    seconds = 6.0  # runs longer than the measurement: no release wakes anyone meanwhile
    with make_fleet(child_env, tmp_path, visibility=visibility) as fleet:
        fleet.relay()
        fleet.workers(db, 2)
        limits_cli(fleet, "set", "task", "f_conc", "--concurrency", "1")
        ids = enqueue(db, "f_conc", [{"seconds": seconds} for _ in range(16)])
        wait_until(
            lambda: one(db, RUNNING, ("f_conc",)) == 1 and one(db, PARKED, ("f_conc",)) == 15,
            30,
            message=lambda: f"1 running, 15 parked\n{fleet.logs()}",
        )
        raised_at = limits_cli(fleet, "clear", "task", "f_conc")  # the declaration (3) is in force again
        wait_until(lambda: one(db, RUNNING, ("f_conc",)) == 3, 15, message=lambda: f"3 running\n{fleet.logs()}")
        reached = float(
            one(
                db,
                "SELECT extract(epoch FROM max(started_at))::float8 FROM postbox.outbox"
                " WHERE id = ANY(%s) AND state = 'running'",
                (ids,),
            )
        )
        raise_s = reached - raised_at
        # Lowered while 3 run: no job starts until fewer than 1 runs.
        lowered_at = limits_cli(fleet, "set", "task", "f_conc", "--concurrency", "1")
        wait_until(lambda: one(db, RUNNING, ("f_conc",)) <= 1, seconds + 15, message=lambda: fleet.logs())
        lower_s = db_now(db) - lowered_at
        wait_until(
            lambda: one(db, "SELECT count(*) FROM flow_runs WHERE started > %s", (lowered_at,)) >= 2,
            3 * seconds + 20,
            message=lambda: f"two runs under the lowered limit\n{fleet.logs()}",
        )
        limits_cli(fleet, "set", "task", "f_conc", "--concurrency", "16")
        wait_until(lambda: done(db, "f_conc") == 16, 60, message=lambda: f"all done\n{fleet.logs()}")
        runs = runs_of(db, "f_conc")
        after_lower = [(s, e) for s, e in runs if lowered_at < s < lowered_at + 2 * seconds]
        report(
            "limit_change",
            raise_to_3_s=round(raise_s, 2),
            lower_to_1_s=round(lower_s, 2),
            job_seconds=seconds,
        )
        # Raised: the reload (every 1 s) wakes the parked jobs, the relay publishes them.
        assert raise_s <= 3.0, raise_s
        # Lowered: the runs started after the change never overlap one another, nor the
        # runs that were already going beyond the new limit (they end on their own).
        for start, _ in after_lower:
            others = [1 for s, e in runs if s < start < e]
            assert not others, (start, runs)
        assert one(db, "SELECT array_agg(DISTINCT attempts) FROM postbox.outbox") == [1]


def test_a_worker_resumed_from_sigstop_obeys_the_limits_changed_while_it_was_stopped(
    child_env: dict[str, str], tmp_path: Path, db: psycopg.Connection[Any]
) -> None:
    with make_fleet(child_env, tmp_path, visibility=5.0) as fleet:
        fleet.relay()
        victim = fleet.workers(db, 1)[0]
        enqueue(db, "f_conc", [{"seconds": 0.05}])
        enqueue(db, "f_rate", [{}])
        wait_until(lambda: done(db, "f_conc") == 1 and done(db, "f_rate") == 1, 30, message=fleet.logs)
        stopped = time.time()  # the first two jobs have run: every run that starts later is one of the twelve
        victim.send_signal(signal.SIGSTOP)  # its copy of the limits: 3 at once, 50/s
        try:
            limits_cli(fleet, "set", "task", "f_conc", "--concurrency", "1")
            limits_cli(fleet, "set", "task", "f_rate", "--rate", "2/s")
            enqueue(db, "f_conc", [{"seconds": 0.5} for _ in range(6)])
            enqueue(db, "f_rate", [{} for _ in range(6)])
            wait_until(
                lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'queued'") == 12,
                30,
                message=lambda: f"12 published\n{fleet.logs()}",
            )
        finally:
            victim.send_signal(signal.SIGCONT)
        wait_until(
            lambda: done(db, "f_conc") == 7 and done(db, "f_rate") == 7, 60, message=lambda: f"done\n{fleet.logs()}"
        )
        # (selected by the stop, not the resume: a setup quicker than a second put the first job
        # within a second before the resume, which counted it among the six)
        conc = [(s, e) for s, e in runs_of(db, "f_conc") if s >= stopped]
        rate_starts = sorted(s for s, _ in runs_of(db, "f_rate") if s >= stopped)
        first_second = sum(1 for s in rate_starts if s < rate_starts[0] + 1.0)
        gaps = [b - a for a, b in itertools.pairwise(rate_starts)]
        report(
            "resumed_worker",
            conc_max_overlap=f.max_overlap(conc),
            rate_starts_first_second=first_second,
            rate_min_gap_s=round(min(gaps), 3),
        )
        assert len(conc) == 6 and f.max_overlap(conc) == 1
        # 2/s, evenly spaced: starts at most half an interval early (0.25 s apart at least,
        # less the clock rounding), three in any second at the very most.
        assert len(rate_starts) == 6 and first_second <= 3, rate_starts
        assert min(gaps) >= 0.2, gaps
        twice = db.execute("SELECT task, attempts, last_error FROM postbox.outbox WHERE attempts > 1").fetchall()
        assert not twice, twice
