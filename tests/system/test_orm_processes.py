"""Exactly once through the ORM on real processes: a worker SIGKILLed mid-body, restarted.

``postbox worker run`` (``python -m postbox.worker run``) with the handlers of
``tests.harness.tasks.orm``: SQLAlchemy (a sync ``Session`` in a sync handler,
an ``AsyncSession`` in an async one) and Django's ORM in ``ctx.atomic()``. The
body writes its effect through the ORM (sent to PostgreSQL, not committed),
says it started, and waits on a gate the test holds; the test SIGKILLs the
worker there, restarts one, opens the gate. The killed run's writes die with
its connection; the restarted worker takes the job over after the visibility
timeout and commits the effect with the job's success: one effect row, one
processed row, the job succeeded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.fleet import Fleet, one, worker_id_of
from tests.harness.tasks import orm
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(child_env, tmp_path, tasks="tests.harness.tasks.orm", queue=orm.QUEUE) as procs:
        yield procs


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(orm.DDL)
        yield conn


def wait_for(condition: Any, within: float, what: str, fleet: Fleet) -> Any:
    return wait_until(condition, within, message=lambda: f"{what}\n{fleet.logs()}")


@pytest.mark.parametrize("task_name", ["orm_sa_effect", "orm_sa_async_effect", "orm_django_effect"])
def test_sigkill_mid_orm_body_then_restart_commits_the_effect_exactly_once(
    fleet: Fleet, db: psycopg.Connection[Any], task_name: str
) -> None:
    fleet.relay()
    first = fleet.worker()
    wait_for(lambda: worker_id_of(db, first), 20, "first worker up", fleet)
    first_id = worker_id_of(db, first)
    job_id = postbox.enqueue(db, task_name, {"label": task_name, "block": True})

    # Mid-body: the effect is written through the ORM in the job's open transaction.
    wait_for(lambda: one(db, "SELECT count(*) FROM orm_started") == 1, 30, "the body running", fleet)
    assert one(db, "SELECT worker_id FROM orm_started") == first_id
    in_tx = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()"
    assert one(db, in_tx) >= 1
    assert one(db, "SELECT count(*) FROM orm_effects") == 0  # not committed
    first.kill()
    assert first.wait(10) != 0

    second = fleet.worker()
    wait_for(lambda: worker_id_of(db, second), 20, "restarted worker up", fleet)
    second_id = worker_id_of(db, second)
    db.execute("INSERT INTO orm_gate (label) VALUES (%s)", (task_name,))
    wait_for(
        lambda: one(db, "SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)) == "succeeded",
        40, "the job succeeded after the restart", fleet,
    )  # fmt: skip
    started = db.execute("SELECT worker_id FROM orm_started ORDER BY worker_id = %s", (second_id,)).fetchall()
    assert started == [(first_id,), (second_id,)]  # the body ran twice ...
    assert one(db, "SELECT count(*) FROM orm_effects") == 1  # ... its effect committed once
    assert one(db, "SELECT job_id FROM orm_effects") == job_id
    assert one(db, "SELECT count(*) FROM postbox.processed_jobs WHERE outbox_id = %s", (job_id,)) == 1
    assert db.execute("SELECT worker_id, outcome FROM postbox.job_attempts WHERE outcome = 'succeeded'").fetchall() == [
        (second_id, "succeeded")
    ]
