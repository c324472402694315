"""Real worker processes, real signals: SIGKILL, SIGSTOP/SIGCONT, os._exit poison, SIGTERM drain.

Every scenario runs the real relay process too (``python -m relay run``) and
uses a 2 s visibility timeout. Processes are killed in teardown whatever happens.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.fleet import VISIBILITY, Fleet, one, worker_id_of
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


def test_sigkill_mid_job_another_worker_finishes_it_after_the_visibility_timeout(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    fleet.relay()
    first = fleet.worker()
    wait_until(lambda: worker_id_of(db, first), 20, message=lambda: f"first worker up\n{fleet.logs()}")
    job_id = postbox.enqueue(db, t.w_slow_effect, {"seconds": 1.5})
    first_id = worker_id_of(db, first)
    wait_until(
        lambda: one(db, "SELECT claimed_by FROM postbox.outbox WHERE state = 'running'") == first_id,
        20,
        message=lambda: f"claim\n{fleet.logs()}",
    )
    first.kill()
    first.wait(10)
    killed = time.monotonic()
    second = fleet.worker()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "succeeded",
        30,
        message=lambda: f"takeover\n{fleet.logs()}",
    )
    assert time.monotonic() - killed >= VISIBILITY
    second_id = worker_id_of(db, second)
    # The lost run is in the history, once (issue 28): it was not running alone (no row at
    # its start), so it is not charged (Interrupted: the budget grows by one) and the
    # takeover ran alone (issue 14, defect 8).
    assert db.execute(
        "SELECT attempt, worker_id, outcome, error_class FROM postbox.job_attempts ORDER BY attempt"
    ).fetchall() == [(1, first_id, "lost", "Interrupted"), (2, second_id, "succeeded", None)]
    assert db.execute("SELECT attempts, max_attempts, last_error_class FROM postbox.outbox").fetchall() == [
        (2, 5, "Interrupted")
    ]
    assert db.execute("SELECT job_id, attempt, worker_id FROM worker_effects").fetchall() == [(job_id, 2, second_id)]


def test_sigstop_for_twice_the_visibility_timeout_then_sigcont_effect_happens_once(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    fleet.relay()
    stalled = fleet.worker()
    wait_until(lambda: worker_id_of(db, stalled), 20, message=lambda: f"worker up\n{fleet.logs()}")
    stalled_id = worker_id_of(db, stalled)
    postbox.enqueue(db, t.w_slow_effect, {"seconds": 1.0})
    wait_until(
        lambda: one(db, "SELECT claimed_by FROM postbox.outbox WHERE state = 'running'") == stalled_id,
        20,
        message=lambda: f"claim\n{fleet.logs()}",
    )
    stalled.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    other = fleet.worker()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "succeeded",
        30,
        message=lambda: f"takeover\n{fleet.logs()}",
    )
    other_id = worker_id_of(db, other)
    wait_until(lambda: time.monotonic() - stopped >= 2 * VISIBILITY, 10, message="twice the visibility timeout")
    stalled.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    # The resumed worker finishes its stale run: its transaction finds the job
    # already processed, and its outcome write is refused by the fence.
    caught_up = "SELECT in_flight = 0 AND last_seen > now() - interval '1 second' FROM postbox.workers WHERE id = %s"
    wait_until(
        lambda: one(db, caught_up, (stalled_id,)) and time.monotonic() - resumed > 1.5,
        20,
        message=lambda: f"stalled worker caught up\n{fleet.logs()}",
    )
    assert stalled.poll() is None
    assert one(db, "SELECT count(*) FROM worker_effects") == 1
    # The stalled run: recorded lost once, by the takeover, and not charged (see the SIGKILL
    # test); its late outcome was refused by the fence, which leaves that row as it was.
    assert db.execute("SELECT state, attempts, claimed_by FROM postbox.outbox").fetchall() == [("succeeded", 2, None)]
    assert db.execute(
        "SELECT attempt, worker_id, outcome, error_class FROM postbox.job_attempts ORDER BY attempt"
    ).fetchall() == [(1, stalled_id, "lost", "Interrupted"), (2, other_id, "succeeded", None)]


def test_os_exit_poison_job_is_dead_after_max_attempts_while_other_jobs_flow(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    fleet.relay()
    workers = [fleet.worker(concurrency=4) for _ in range(2)]
    wait_until(lambda: all(worker_id_of(db, w) for w in workers), 20, message=lambda: f"workers up\n{fleet.logs()}")
    poison = postbox.enqueue(db, t.w_poison)
    others = postbox.enqueue_many(db, [{"task": "w_noop"} for _ in range(40)])
    deaths = 0

    def settled() -> bool:
        nonlocal deaths
        for i, proc in enumerate(workers):  # a process manager restarts what died
            if proc.poll() is not None:
                assert proc.returncode == 1
                deaths += 1
                workers[i] = fleet.worker(concurrency=4)
        return bool(
            one(db, "SELECT state = 'dead' FROM postbox.outbox WHERE id = %s", (poison,))
            and one(db, "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND state = 'succeeded'", (others,))
            == 40
        )

    wait_until(settled, 60, message=lambda: f"poison dead and the rest done\n{fleet.logs()}")
    # Its first crash is not charged (it ran among others: any of them may have crashed
    # the process); run alone afterwards, each crash is its own (issue 14, defect 8).
    assert deaths == 4
    # Every run is in its history: the first, interrupted (not charged), then three of its own.
    assert db.execute(
        "SELECT state, attempts, last_error_class FROM postbox.outbox WHERE id = %s", (poison,)
    ).fetchall() == [("dead", 4, "AttemptsExhausted")]
    assert db.execute(
        "SELECT attempt, outcome, error_class FROM postbox.job_attempts WHERE outbox_id = %s ORDER BY attempt",
        (poison,),
    ).fetchall() == [(1, "lost", "Interrupted"), (2, "lost", None), (3, "lost", None), (4, "lost", None)]
    # A job read in the same batch as the poison dies with its process and is taken
    # over with it: never charged for it (its lost run is recorded Interrupted), run alone.
    assert (
        one(
            db,
            "SELECT max(o.attempts - (SELECT count(*) FROM postbox.job_attempts a WHERE a.outbox_id = o.id"
            " AND a.outcome = 'lost' AND a.error_class = 'Interrupted')) FROM postbox.outbox o WHERE o.id <> %s",
            (poison,),
        )
        == 1
    )


def test_sigterm_with_a_job_in_flight_finishes_it_and_exits_0(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    fleet.relay()
    proc = fleet.worker()
    wait_until(lambda: worker_id_of(db, proc), 20, message=lambda: f"worker up\n{fleet.logs()}")
    wid = worker_id_of(db, proc)
    job_id = postbox.enqueue(db, t.w_slow_effect, {"seconds": 1.0})
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "running",
        20,
        message=lambda: f"job running\n{fleet.logs()}",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert db.execute("SELECT state, attempts, claimed_by FROM postbox.outbox").fetchall() == [("succeeded", 1, None)]
    assert db.execute("SELECT job_id, worker_id FROM worker_effects").fetchall() == [(job_id, wid)]
    assert one(db, "SELECT stopped_at IS NOT NULL FROM postbox.workers WHERE id = %s", (wid,)) is True


def test_sigterm_past_the_drain_timeout_leaves_the_job_unacknowledged_for_another_worker(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    fleet.relay()
    proc = fleet.worker(POSTBOX_DRAIN_TIMEOUT="0.3")
    wait_until(lambda: worker_id_of(db, proc), 20, message=lambda: f"worker up\n{fleet.logs()}")
    postbox.enqueue(db, t.w_slow_effect, {"seconds": 2.0})
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "running",
        20,
        message=lambda: f"job running\n{fleet.logs()}",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert one(db, "SELECT state FROM postbox.outbox") == "running"  # nothing recorded, nothing acknowledged
    assert one(db, "SELECT count(*) FROM worker_effects") == 0
    successor = fleet.worker()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "succeeded",
        30,
        message=lambda: f"successor finishes it\n{fleet.logs()}",
    )
    assert db.execute("SELECT attempt, outcome, error_class FROM postbox.job_attempts ORDER BY attempt").fetchall() == [
        (1, "lost", "Interrupted"),  # the abandoned run: in the history, not charged (issue 14, defect 8)
        (2, "succeeded", None),
    ]
    assert one(db, "SELECT worker_id FROM worker_effects") == worker_id_of(db, successor)


def test_a_second_sigterm_ends_the_drain_at_once(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    proc = fleet.worker(POSTBOX_DRAIN_TIMEOUT="60")
    wait_until(lambda: worker_id_of(db, proc), 20, message=lambda: f"worker up\n{fleet.logs()}")
    job_id = postbox.enqueue(db, t.w_slow_effect, {"seconds": 30.0})
    fleet.relay()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox") == "running",
        20,
        message=lambda: f"job running\n{fleet.logs()}",
    )
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining" in fleet.logs(), 10, message=lambda: f"drain started\n{fleet.logs()}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert db.execute("SELECT id, state FROM postbox.outbox").fetchall() == [
        (job_id, "running")
    ]  # left for another worker
    assert one(db, "SELECT count(*) FROM worker_effects") == 0
