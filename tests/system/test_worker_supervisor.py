"""``postbox worker run --processes N``: a supervisor process and its N worker processes, real signals.

Every scenario runs real processes on the test's PostgreSQL and Redis (2 s visibility timeout, 10 s drain:
tests/harness/fleet.py); every process is killed in teardown whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

import postbox
from tests.harness.api import insert_job
from tests.harness.fleet import WORKER_QUEUE, WORKER_TASKS, Fleet, one
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


def supervisor(fleet: Fleet, processes: int = 2, **env: str) -> subprocess.Popen[bytes]:
    argv = ["--tasks", WORKER_TASKS, "--queues", WORKER_QUEUE, "--concurrency", "1"]
    return fleet.start("-m", "postbox.worker", "run", *argv, "--processes", str(processes), name="supervisor", **env)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def children(proc: subprocess.Popen[bytes]) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(proc.pid).children() if alive(child.pid)}
    except psutil.NoSuchProcess:
        return set()


def registered(db: psycopg.Connection[Any]) -> dict[int, str]:
    """Running workers of this test's database: pid -> worker id."""
    rows = db.execute("SELECT pid, id FROM postbox.workers WHERE stopped_at IS NULL").fetchall()
    return {pid: worker_id for pid, worker_id in rows}


def workers_up(
    fleet: Fleet, db: psycopg.Connection[Any], proc: subprocess.Popen[bytes], count: int, *, without: int = 0
) -> set[int]:
    """The pids of the supervisor's ``count`` children (``without`` that one), once each has registered."""

    def up() -> set[int]:
        assert proc.poll() is None, fleet.logs()
        pids = children(proc)
        return pids if len(pids) == count and without not in pids and pids <= set(registered(db)) else set()

    return wait_until(up, 60, message=lambda: f"{count} worker processes registered\n{fleet.logs()}")


def stop(fleet: Fleet, proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the supervisor did not end\n{fleet.logs()}") from None


def test_two_processes_share_a_backlog_and_every_job_succeeds_once(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    proc = supervisor(fleet)
    pids = workers_up(fleet, db, proc, 2)
    ids = registered(db)
    jobs = postbox.enqueue_many(db, [{"task": "w_slow_effect", "args": {"seconds": 0.05}} for _ in range(40)])
    fleet.relay()
    done = "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'"
    wait_until(lambda: one(db, done) == 40, 60, message=lambda: f"40 jobs succeeded\n{fleet.logs()}")

    assert db.execute("SELECT count(*), count(DISTINCT job_id) FROM worker_effects").fetchone() == (40, 40)
    assert sorted(r[0] for r in db.execute("SELECT job_id FROM worker_effects").fetchall()) == sorted(jobs)
    workers = {r[0] for r in db.execute("SELECT DISTINCT worker_id FROM worker_effects").fetchall()}
    assert workers == {ids[pid] for pid in pids}  # both processes took part, nobody else
    assert db.execute(
        "SELECT count(*) FROM postbox.job_attempts WHERE attempt = 1 AND outcome = 'succeeded'"
    ).fetchone() == (40,)
    assert one(db, "SELECT count(*) FROM postbox.job_attempts") == 40

    assert stop(fleet, proc) == 0, fleet.logs()
    assert not any(alive(pid) for pid in pids)


def test_a_killed_worker_process_is_restarted_and_its_job_still_succeeds_once(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    proc = supervisor(fleet)
    first = workers_up(fleet, db, proc, 2)
    postbox.enqueue_many(db, [{"task": "w_slow_effect", "args": {"seconds": 0.3}} for _ in range(20)])
    fleet.relay()
    ids = registered(db)
    running = "SELECT claimed_by FROM postbox.outbox WHERE state = 'running' LIMIT 1"
    victim_id = wait_until(lambda: one(db, running), 30, message=lambda: f"a job running\n{fleet.logs()}")
    victim = next(pid for pid in first if ids[pid] == victim_id)
    os.kill(victim, signal.SIGKILL)

    restarted = workers_up(fleet, db, proc, 2, without=victim)
    assert len(restarted - first) == 1
    done = "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'"
    wait_until(lambda: one(db, done) == 20, 60, message=lambda: f"20 jobs succeeded\n{fleet.logs()}")
    assert db.execute("SELECT count(*), count(DISTINCT job_id) FROM worker_effects").fetchone() == (20, 20)
    assert f"worker process {victim} was killed by SIGKILL; restarting it in 1.0 s" in fleet.logs()

    assert stop(fleet, proc) == 0, fleet.logs()
    assert not any(alive(pid) for pid in restarted)


def test_sigterm_drains_every_worker_process_and_the_supervisor_exits_0(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    proc = supervisor(fleet)
    pids = workers_up(fleet, db, proc, 2)
    ids = registered(db)
    jobs = postbox.enqueue_many(db, [{"task": "w_slow_effect", "args": {"seconds": 2.0}} for _ in range(2)])
    fleet.relay()
    running = "SELECT count(DISTINCT claimed_by) FROM postbox.outbox WHERE state = 'running'"
    wait_until(lambda: one(db, running) == 2, 30, message=lambda: f"a job running in each process\n{fleet.logs()}")

    assert stop(fleet, proc) == 0, fleet.logs()
    # Both in-flight jobs finished in the drain: one run each, by the two processes.
    assert db.execute("SELECT state, attempts FROM postbox.outbox ORDER BY id").fetchall() == [("succeeded", 1)] * 2
    assert sorted(db.execute("SELECT job_id FROM worker_effects").fetchall()) == [(job,) for job in sorted(jobs)]
    assert {r[0] for r in db.execute("SELECT worker_id FROM worker_effects").fetchall()} == set(ids.values())
    assert not any(alive(pid) for pid in pids)
    assert registered(db) == {}  # each marked its registry row stopped: a drain, not a death
    forwarded = [line for line in fleet.logs().splitlines() if "SIGTERM: stopping; forwarded to" in line]
    assert len(forwarded) == 1 and all(str(pid) in forwarded[0] for pid in pids), fleet.logs()


def test_a_second_sigterm_is_forwarded_and_ends_the_drain_at_once(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    proc = supervisor(fleet, POSTBOX_DRAIN_TIMEOUT="60")
    pids = workers_up(fleet, db, proc, 2)
    postbox.enqueue_many(db, [{"task": "w_slow_effect", "args": {"seconds": 60.0}} for _ in range(2)])
    fleet.relay()
    running = "SELECT count(DISTINCT claimed_by) FROM postbox.outbox WHERE state = 'running'"
    wait_until(lambda: one(db, running) == 2, 30, message=lambda: f"a job running in each process\n{fleet.logs()}")
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM: stopping" in fleet.logs(), 30, message=lambda: f"first signal\n{fleet.logs()}")
    proc.send_signal(signal.SIGTERM)
    second = time.monotonic()

    assert proc.wait(60) == 0, fleet.logs()
    assert time.monotonic() - second < 30  # not the 60 s drain
    assert "SIGTERM again: forwarded to worker processes" in fleet.logs()
    # The drain ended at once: both jobs left unacknowledged, running, for a takeover.
    assert db.execute("SELECT state, attempts FROM postbox.outbox").fetchall() == [("running", 1)] * 2
    assert one(db, "SELECT count(*) FROM worker_effects") == 0
    assert not any(alive(pid) for pid in pids)


def test_a_killed_supervisor_takes_its_worker_processes_with_it(fleet: Fleet, db: psycopg.Connection[Any]) -> None:
    proc = supervisor(fleet)
    pids = workers_up(fleet, db, proc, 2)
    proc.kill()
    proc.wait(10)
    # PR_SET_PDEATHSIG: each gets SIGTERM, drains (nothing in flight) and marks its row stopped.
    wait_until(lambda: not any(alive(pid) for pid in pids), 30, message=lambda: f"children gone\n{fleet.logs()}")
    assert registered(db) == {}


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)


def test_bad_process_counts_are_refused_before_anything_starts(
    child_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    base = ["-m", "postbox.worker", "run", "--tasks", WORKER_TASKS]
    for value in ("0", "-1"):
        done = run([*base, "--processes", value], child_env)
        assert done.returncode == 2, done.stderr
        assert (
            "postbox worker: invalid settings: POSTBOX_WORKER_PROCESSES: Input should be greater than or equal to 1"
            in done.stderr
        )
    done = run([*base, "--processes", "two"], child_env)
    assert done.returncode == 2 and "argument --processes: invalid int value: 'two'" in done.stderr
    done = run(base, {**child_env, "POSTBOX_WORKER_PROCESSES": "two"})
    assert done.returncode == 2 and "POSTBOX_WORKER_PROCESSES: Input should be a valid integer" in done.stderr
    assert one(db, "SELECT count(*) FROM postbox.workers") == 0


def test_a_configuration_error_in_the_workers_stops_the_supervisor_with_exit_2(
    child_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    done = run(["-m", "postbox.app", "worker", "run", "--tasks", "tests.no_such_tasks", "--processes", "2"], child_env)
    assert done.returncode == 2, done.stderr
    assert "postbox worker: POSTBOX_TASKS: cannot import tests.no_such_tasks" in done.stderr  # the child's message
    assert "exited with status 2: a configuration error" in done.stderr
    assert "restarting" not in done.stderr
    assert one(db, "SELECT count(*) FROM postbox.workers") == 0


def test_a_supervisor_started_from_a_script_elsewhere_gives_its_workers_the_scripts_folder(
    fleet: Fleet, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """``python /srv/shop/manage.py postbox worker run --processes 2`` from another directory: the children
    import the task modules next to the script, as the supervisor did."""
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "shop_tasks.py").write_text(
        "from postbox import task\n\n\n"
        "@task(queue='shopq')\n"
        "async def shop_effect(ctx, n: int) -> None:\n"
        "    async with ctx.transaction() as conn:\n"
        "        await conn.execute(\n"
        "            'INSERT INTO worker_effects (job_id, label, attempt, worker_id) VALUES (%s, %s, %s, %s)',\n"
        "            (ctx.job_id, f'shop-{n}', ctx.attempt, ctx.worker_id),\n"
        "        )\n"
    )
    script = "import sys\n\nfrom postbox.worker.cli import main\n\nsys.exit(main(sys.argv[1:]))\n"
    (shop / "run_worker.py").write_text(script)
    proc = fleet.start(
        str(shop / "run_worker.py"), "run", "--tasks", "shop_tasks", "--processes", "2", name="supervisor"
    )
    assert Path.cwd() != shop  # the tests run from the repository: shop_tasks is importable only via the script
    workers_up(fleet, db, proc, 2)
    jobs = [insert_job(db, "shop_effect", "shopq", args=f'{{"n": {n}}}') for n in range(6)]
    fleet.relay()
    done = "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'"
    wait_until(lambda: one(db, done) == 6, 60, message=lambda: f"6 jobs succeeded\n{fleet.logs()}")
    assert sorted(r[0] for r in db.execute("SELECT job_id FROM worker_effects").fetchall()) == sorted(jobs)
    assert stop(fleet, proc) == 0, fleet.logs()
