"""Workflows on real processes under faults: every job ends, every callback runs once or is cancelled by policy.

A relay and three workers run chains, groups and fan-ins of effect-writing jobs
(tests/harness/tasks/workflow.py: each effect is a ``wf_log`` row written in the
job's ``ctx.transaction()``), while one worker is SIGKILLed mid-job, another is
SIGSTOPped past its lease and resumed, the leading relay is SIGKILLed (the
standby takes over), and this test's Redis keys are deleted
(the relay's Redis-loss path). Some children fail permanently: their workflow's
callback is cancelled (policy ``cancel``) or runs with the failure recorded
(policy ``record``). At the end: no job left unended, no effect twice, every
callback once or cancelled as its policy says.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import postbox
from postbox.workflow import chain, chord, group
from tests.harness.tasks import workflow as w
from tests.harness.wait import wait_until
from tests.system.test_worker_processes import VISIBILITY, Fleet, one, worker_id_of

# Under the soak marker (`make soak`), not `make test`: in two runs of the whole suite of about
# eight, 23 jobs were left unended after 120 s (a step `running` under the killed worker's claim,
# its dependents `waiting`); alone it passed every time. Issue 31 stays open until the cause is
# found; the timeout prints the stuck jobs.
pytestmark = [pytest.mark.system, pytest.mark.soak]

TASKS = "tests.harness.tasks.workflow"
WORKFLOWS = 12


class WorkflowFleet(Fleet):
    def worker(self, concurrency: int = 4, **env: str) -> Any:
        return self.start(
            "-m", "postbox.worker", "run", "--tasks", TASKS, "--queues", w.QUEUE,
            "--concurrency", str(concurrency), name="worker", **env,
        )  # fmt: skip


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path) -> Iterator[WorkflowFleet]:
    procs = WorkflowFleet(child_env, tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def declare(k: int) -> tuple[Any, str]:
    """Workflow ``k``: a head, a fan-in of slow and quick children (a failing one in every third), a tail."""
    children = [w.wf_slow.s(label=f"{k}-slow{i}", seconds=0.4) for i in range(4)]
    children += [w.wf_step.s(label=f"{k}-quick{i}") for i in range(4)]
    fails = k % 3 == 0
    if fails:
        children.append(w.wf_fail.s(label=f"{k}-fail"))
    callback = w.wf_collect.s(label=f"{k}-callback")
    policy = "record" if k % 2 == 0 else "cancel"
    flow = chain(
        w.wf_step.s(label=f"{k}-head"),
        chord(group(children), callback),
        w.wf_step.s(label=f"{k}-tail"),
    )
    return flow, policy


def test_workflows_under_killed_frozen_workers_and_lost_redis_end_with_each_callback_once(
    fleet: WorkflowFleet, database_url: str, redis_url: str, child_env: dict[str, str]
) -> None:
    prefix = child_env["POSTBOX_REDIS_PREFIX"]
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(w.LOG_DDL)
        relays = [fleet.relay(), fleet.relay()]  # one leads, one stands by
        victim, frozen, steady = fleet.worker(), fleet.worker(), fleet.worker()
        wait_until(
            lambda: all(worker_id_of(db, p) for p in (victim, frozen, steady)),
            30,
            message=lambda: f"workers up\n{fleet.logs()}",
        )
        planned: dict[int, tuple[str, bool]] = {}
        with psycopg.connect(database_url) as producer:
            for k in range(WORKFLOWS):
                flow, policy = declare(k)
                ids = postbox.enqueue_workflow(producer, flow, name=f"fault-{k}", on_failure=policy)  # type: ignore[arg-type]
                planned[ids.id] = (policy, k % 3 == 0)
            producer.commit()
        faults = 0
        victim_id = worker_id_of(db, victim)
        wait_until(
            lambda: one(
                db, "SELECT count(*) FROM postbox.outbox WHERE state = 'running' AND claimed_by = %s", (victim_id,)
            ),
            30,
            message=lambda: f"the victim running a job\n{fleet.logs()}",
        )
        victim.send_signal(signal.SIGKILL)
        faults += 1
        leader = one(db, "SELECT pid FROM postbox.relays WHERE role = 'leader' ORDER BY last_seen DESC LIMIT 1")
        for proc in relays:
            if proc.pid == leader:
                proc.send_signal(signal.SIGKILL)  # the standby takes over
                faults += 1
        fleet.worker()  # a replacement
        frozen.send_signal(signal.SIGSTOP)
        faults += 1
        client = redis.Redis.from_url(redis_url)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)  # this test's streams, groups and epoch: Redis lost its data
            faults += 1
        finally:
            client.close()
        time.sleep(VISIBILITY * 2)  # frozen past its lease: its runs are taken over
        frozen.send_signal(signal.SIGCONT)

        def unended() -> int:
            return int(
                one(
                    db,
                    "SELECT count(*) FROM postbox.outbox WHERE workflow_id IS NOT NULL"
                    " AND state NOT IN ('succeeded', 'dead', 'cancelled', 'expired')",
                )
            )

        def left() -> str:
            rows = db.execute(
                "SELECT id, task, state, attempts, waiting_on, published_at IS NOT NULL, claimed_by"
                " FROM postbox.outbox WHERE workflow_id IS NOT NULL"
                " AND state NOT IN ('succeeded', 'dead', 'cancelled', 'expired') ORDER BY id"
            ).fetchall()
            return f"{len(rows)} left: {rows[:12]}"

        wait_until(lambda: unended() == 0, 120, message=lambda: f"every job ended ({left()})\n{fleet.logs()[-4000:]}")

        # No effect twice: one wf_log row per job at most.
        duplicates = one(db, "SELECT count(*) FROM (SELECT job_id FROM wf_log GROUP BY job_id HAVING count(*) > 1) d")
        assert duplicates == 0
        callbacks_run = 0
        for workflow_id, (policy, fails) in planned.items():
            rows = db.execute(
                "SELECT o.task, o.state, count(l.id) FROM postbox.outbox o LEFT JOIN wf_log l ON l.job_id = o.id"
                " WHERE o.workflow_id = %s GROUP BY o.id, o.task, o.state ORDER BY o.id",
                (workflow_id,),
            ).fetchall()
            by_task: dict[str, list[tuple[str, int]]] = {}
            for task_name, state, effects in rows:
                by_task.setdefault(task_name, []).append((state, effects))
            ((cb_state, cb_effects),) = by_task["wf_collect"]
            if fails and policy == "cancel":
                assert (cb_state, cb_effects) == ("cancelled", 0), workflow_id
                assert by_task["wf_fail"] == [("dead", 0)]
            else:
                assert (cb_state, cb_effects) == ("succeeded", 1), workflow_id
                callbacks_run += 1
            # every effect-writing job that succeeded wrote its effect exactly once
            for task_name in ("wf_step", "wf_slow"):
                assert all(effects == (1 if state == "succeeded" else 0) for state, effects in by_task[task_name])
        stuck = unended()
        print(
            f"\nworkflow fault test: {len(planned)} workflows, "
            f"{one(db, 'SELECT count(*) FROM postbox.outbox WHERE workflow_id IS NOT NULL')} jobs, {faults} faults,"
            f" callbacks run {callbacks_run}, duplicates {duplicates}, stuck {stuck}"
        )
        assert stuck == 0
        # the frozen worker's takeover and the kill show in the history as lost attempts
        assert one(db, "SELECT count(*) FROM postbox.job_attempts WHERE outcome = 'lost'") >= 1
