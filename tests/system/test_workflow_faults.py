"""Workflows on real processes under faults: every job ends, every callback runs once or is cancelled by policy.

Two relays (one leads) and four workers run chains, groups and fan-ins of
effect-writing jobs (tests/harness/tasks/workflow.py: each effect is a ``wf_log``
row written in the job's ``ctx.transaction()``, with what it read upstream).
Meanwhile a worker is SIGKILLed mid-job, the leading relay is SIGKILLed (the
standby takes over), a worker is SIGSTOPped while it runs a job and kept stopped
past its lease, this test's Redis keys are deleted (Redis lost its data: streams,
pending entries, groups, epoch), and a second worker is SIGKILLed mid-job after
the loss. Some children fail permanently: their workflow's callback is cancelled
(policy ``cancel``), runs with the failure recorded (``record``) or runs anyway
(``run``).

At the end the counts are exact: every job ended in the state its workflow's
policy says; one effect per effect-writing job that succeeded and none for the
others (no duplicate); each callback ran once or was cancelled; every run the
killed workers held is in the history as lost. The summary line printed is the
one quoted in issue 31's closing note.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import redis

import postbox
from postbox.workflow import Canvas, chain, chord, group
from tests.harness.tasks import workflow as w
from tests.harness.wait import wait_until
from tests.system.test_worker_processes import VISIBILITY, Fleet, one, worker_id_of

pytestmark = pytest.mark.system

TASKS = "tests.harness.tasks.workflow"
WORKFLOWS = 12
POLICIES = ("cancel", "record", "run")
WIDE = 20  # extra children of workflow 1: a fan-in of more than 16 parents counts them in join shards
ENDED = ("succeeded", "dead", "cancelled", "expired")


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


@dataclass(frozen=True)
class Planned:
    """What workflow ``k`` must end as."""

    policy: str
    fails: bool
    leaves: int  # the callback's upstream jobs (the group's last jobs)

    @property
    def callback_runs(self) -> bool:
        return not (self.fails and self.policy == "cancel")


def declare(k: int) -> tuple[Canvas, Planned]:
    """Workflow ``k``: a head, a group (slow and quick jobs, a nested chain, one without a transaction,
    a permanently failing child in every other workflow) fanning in to a callback, then a tail."""
    children: list[Canvas] = [w.wf_slow.s(label=f"{k}-slow{i}", seconds=0.4) for i in range(4)]
    children += [w.wf_step.s(label=f"{k}-quick{i}") for i in range(4 + (WIDE if k == 1 else 0))]
    children.append(chain(w.wf_step.s(label=f"{k}-first"), w.wf_slow.s(label=f"{k}-then", seconds=0.2)))
    children.append(w.wf_plain.s(label=f"{k}-plain"))
    fails = k % 2 == 0
    if fails:
        children.append(w.wf_fail.s(label=f"{k}-fail"))
    flow = chain(
        w.wf_step.s(label=f"{k}-head"),
        chord(group(children), w.wf_collect.s(label=f"{k}-callback")),
        w.wf_step.s(label=f"{k}-tail"),
    )
    return flow, Planned(POLICIES[k % 3], fails, len(children))


def running_on(db: psycopg.Connection[Any], worker_id: str) -> set[tuple[int, int]]:
    """(job id, attempt) of the runs claimed by ``worker_id`` that have no outcome yet."""
    rows = db.execute(
        "SELECT id, attempts FROM postbox.outbox WHERE state = 'running' AND claimed_by = %s", (worker_id,)
    )
    return {(row[0], row[1]) for row in rows}


def test_workflows_under_killed_frozen_workers_and_lost_redis_end_with_each_callback_once(
    fleet: WorkflowFleet, database_url: str, redis_url: str, child_env: dict[str, str]
) -> None:
    prefix = child_env["POSTBOX_REDIS_PREFIX"]
    faults: Counter[str] = Counter()
    with psycopg.connect(database_url, autocommit=True) as db:
        db.execute(w.LOG_DDL)
        relays = [fleet.relay(), fleet.relay()]  # one leads, one stands by
        victim, frozen, doomed, steady = (fleet.worker() for _ in range(4))
        wait_until(
            lambda: all(worker_id_of(db, p) for p in (victim, frozen, doomed, steady)),
            30,
            message=lambda: f"workers up\n{fleet.logs()}",
        )
        ids = {name: worker_id_of(db, p) for name, p in (("victim", victim), ("frozen", frozen), ("doomed", doomed))}
        planned: dict[int, Planned] = {}
        with psycopg.connect(database_url) as producer:
            for k in range(WORKFLOWS):
                flow, plan = declare(k)
                handle = postbox.enqueue_workflow(producer, flow, name=f"fault-{k}", on_failure=plan.policy)  # type: ignore[arg-type]
                planned[handle.id] = plan
            producer.commit()

        def kill_mid_job(proc: Any, worker_id: str) -> set[tuple[int, int]]:
            """SIGKILL the worker once it runs a job; the runs it held when it died."""
            wait_until(lambda: running_on(db, worker_id), 30, message=lambda: f"{worker_id} running\n{fleet.logs()}")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            faults["worker SIGKILLed mid-job"] += 1
            # Its claims are final now; an outcome whose COMMIT it sent before dying may still land.
            return running_on(db, worker_id)

        lost_with = {ids["victim"]: kill_mid_job(victim, str(ids["victim"]))}
        leader = one(db, "SELECT pid FROM postbox.relays WHERE role = 'leader' ORDER BY last_seen DESC LIMIT 1")
        for proc in relays:
            if proc.pid == leader:
                proc.send_signal(signal.SIGKILL)  # the standby takes over
                faults["leading relay SIGKILLed"] += 1
        assert faults["leading relay SIGKILLed"] == 1
        fleet.worker()  # a replacement
        wait_until(lambda: running_on(db, str(ids["frozen"])), 30, message=lambda: f"frozen running\n{fleet.logs()}")
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        faults["worker SIGSTOPped past its lease"] += 1
        client = redis.Redis.from_url(redis_url)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            assert keys
            client.delete(*keys)  # this test's streams, groups, pending entries and epoch: Redis lost its data
            faults["Redis data lost"] += 1
        finally:
            client.close()
        lost_with[ids["doomed"]] = kill_mid_job(doomed, str(ids["doomed"]))  # after the loss: new streams
        wait_until(lambda: time.monotonic() - stopped >= 2 * VISIBILITY, 30, message="twice the lease")
        frozen.send_signal(signal.SIGCONT)

        def unended() -> list[tuple[Any, ...]]:
            return db.execute(
                "SELECT id, task, state, attempts, waiting_on, stream_id, claimed_by, lease_until < now()"
                " FROM postbox.outbox WHERE workflow_id IS NOT NULL AND state <> ALL(%s) ORDER BY id",
                (list(ENDED),),
            ).fetchall()

        wait_until(
            lambda: not unended(),
            120,
            message=lambda: f"every job ended ({len(unended())} left: {unended()[:12]})\n{fleet.logs()[-4000:]}",
        )

        # Every run a killed worker held has its attempt in the history: lost (taken over or released),
        # or, for an outcome whose COMMIT reached PostgreSQL as the worker died, that outcome.
        for worker_id, held in lost_with.items():
            ended: dict[int, str] = dict(
                db.execute(
                    "SELECT outbox_id, outcome FROM postbox.job_attempts"
                    " WHERE worker_id = %s AND (outbox_id, attempt) IN (SELECT * FROM unnest(%s::int8[], %s::int4[]))",
                    (worker_id, [job for job, _ in held], [attempt for _, attempt in held]),
                ).fetchall()
            )
            assert sorted(ended) == sorted(job for job, _ in held), (worker_id, held, ended)
        lost_runs = one(db, "SELECT count(*) FROM postbox.job_attempts WHERE outcome = 'lost'")

        def callback(workflow_id: int) -> str:
            """The callback's row and history, for an assertion's message."""
            row = db.execute(
                "SELECT id, state, attempts, max_attempts, last_error_class, last_error, claimed_by"
                " FROM postbox.outbox WHERE workflow_id = %s AND task = 'wf_collect'",
                (workflow_id,),
            ).fetchone()
            assert row is not None
            history = db.execute(
                "SELECT attempt, worker_id, outcome, error_class, error FROM postbox.job_attempts"
                " WHERE outbox_id = %s ORDER BY attempt",
                (row[0],),
            ).fetchall()
            return f"workflow {workflow_id}: callback {row}, history {history}\nkilled: {lost_with}"

        duplicates = one(db, "SELECT count(*) FROM (SELECT job_id FROM wf_log GROUP BY job_id HAVING count(*) > 1) d")
        assert duplicates == 0
        callbacks_run = cancelled_callbacks = 0
        for workflow_id, plan in planned.items():
            rows = db.execute(
                "SELECT o.task, o.state, count(l.id), min(l.upstream::text) FROM postbox.outbox o"
                " LEFT JOIN wf_log l ON l.job_id = o.id WHERE o.workflow_id = %s"
                " GROUP BY o.id, o.task, o.state ORDER BY o.id",
                (workflow_id,),
            ).fetchall()
            by_task: dict[str, list[tuple[str, int]]] = {}
            for task_name, state, effects, _ in rows:
                by_task.setdefault(task_name, []).append((state, effects))
            # The jobs before the callback all ran: one effect each (the plain job writes none).
            for task_name in ("wf_step", "wf_slow"):
                assert all(effects == (1 if s == "succeeded" else 0) for s, effects in by_task[task_name])
            assert by_task["wf_plain"] == [("succeeded", 0)]
            ((cb_state, cb_effects),) = by_task["wf_collect"]
            [tail_state] = [s for task_name, s, _, _ in rows if task_name == "wf_step"][-1:]
            if plan.fails:
                assert by_task["wf_fail"] == [("dead", 0)], workflow_id
            if plan.callback_runs:
                assert (cb_state, cb_effects, tail_state) == ("succeeded", 1, "succeeded"), callback(workflow_id)
                callbacks_run += 1
                [seen] = [orjson.loads(up) for task_name, _, _, up in rows if task_name == "wf_collect"]
                failed = ["dead"] if plan.fails else []
                assert sorted(seen["states"]) == sorted(["succeeded"] * (plan.leaves - len(failed)) + failed)
                assert seen["failures"] == (failed if plan.policy == "record" else []), workflow_id
            else:
                assert (cb_state, cb_effects, tail_state) == ("cancelled", 0, "cancelled"), callback(workflow_id)
                cancelled_callbacks += 1
        assert (callbacks_run, cancelled_callbacks) == (10, 2)

        states: Counter[str] = Counter(
            dict(db.execute("SELECT state, count(*) FROM postbox.outbox GROUP BY state").fetchall())
        )
        jobs = sum(states.values())
        fails = sum(plan.fails for plan in planned.values())
        expected = 14 * WORKFLOWS + WIDE + fails  # head, 4 slow, 4 quick, 2 chained, plain, callback, tail (+ fail)
        assert jobs == expected
        assert states == Counter(succeeded=jobs - fails - 2 * cancelled_callbacks, dead=fails, cancelled=4)
        effects = one(db, "SELECT count(*) FROM wf_log")
        assert effects == states["succeeded"] - WORKFLOWS  # every succeeded job but the plain ones, once
        stuck = len(unended())
        assert stuck == 0
        print(
            f"\nworkflow fault test: {WORKFLOWS} workflows, {jobs} jobs ({states['succeeded']} succeeded,"
            f" {states['dead']} dead, {states['cancelled']} cancelled); faults: "
            + ", ".join(f"{kind} x{n}" for kind, n in faults.items())
            + f"; lost runs recovered {lost_runs}; callbacks run {callbacks_run}, cancelled by policy"
            f" {cancelled_callbacks}; effects {effects} (each once), duplicates {duplicates}, stuck {stuck}"
        )
