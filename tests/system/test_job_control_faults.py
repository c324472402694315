"""Snooze and progress under a worker SIGKILL (issue 32): nothing lost, nothing run twice.

Real relay and worker processes (``python -m postbox.relay run`` / ``postbox.worker``),
a 2 s visibility timeout; processes are killed in teardown whatever happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.fleet import LEASES, QUICK_RETRIES, Fleet, one
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    # the settings' drain timeout and concurrency
    with Fleet(child_env, tmp_path, settings={**LEASES, **QUICK_RETRIES}, concurrency=None) as procs:
        yield procs


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
