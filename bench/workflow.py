"""``bench workflow``: a fan-in's children drained, against the same jobs without a workflow, paired.

Each repetition runs two drains back to back on a fresh outbox, one relay and
one worker process (``--concurrency``):

- *plain*: ``--jobs`` jobs of ``bench_noop`` (or ``bench_tx`` with
  ``--workflow-task bench_tx``) committed with ``enqueue_many``;
- *fan-in*: the same jobs as one workflow, ``group(children) | callback``,
  committed with ``enqueue_workflow``: every child's outcome counts down the
  callback's join (16 shards) in the statement that records it.

Rates come from PostgreSQL's ``finished_at`` stamps of the children (the
callback excluded), as ``bench worker`` takes them. The figure that matters is
the ratio fan-in / plain per repetition (target >= 0.8): the join's cost per
child. Each fan-in run also checks that its callback ran exactly once.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg

from postbox.workflow import enqueue_workflow, group, signature
from postbox_bench import outbox, tasks
from postbox_bench.params import Params
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.worker import drain, start_system

SCENARIO = "workflow"
WARMUP_JOBS = 2_000

RESET_WORKFLOWS: LiteralString = "TRUNCATE postbox.workflows, postbox.workflow_edges, postbox.workflow_joins"
# The children of the fan-in, and the plain jobs: rows that waited for nothing (the callback did).
CHILD_SPAN: LiteralString = """
SELECT min(finished_at), max(finished_at), count(*),
       count(*) FILTER (WHERE finished_at = (SELECT min(finished_at) FROM postbox.outbox WHERE waiting_on IS NULL))
  FROM postbox.outbox WHERE finished_at IS NOT NULL AND waiting_on IS NULL
"""
CALLBACK: LiteralString = "SELECT state, attempts FROM postbox.outbox WHERE waiting_on IS NOT NULL"


def _reset(box: Sandbox, conn: psycopg.Connection[Any]) -> None:
    outbox.reset(conn)
    conn.execute(RESET_WORKFLOWS)
    conn.commit()
    box.clean_redis_prefix()


def _fan_in(conn: psycopg.Connection[Any], task: str, jobs: int) -> None:
    handle = getattr(tasks, task)
    flow = group(signature(handle, {"n": i}) for i in range(jobs)) | signature(handle, {"n": -1})
    enqueue_workflow(conn, flow, name="bench-fan-in")
    conn.commit()


def _drain(kids: Children, conn: psycopg.Connection[Any], concurrency: int, jobs: int) -> bool:
    start_system(kids, 1, concurrency)
    return drain(conn, kids, jobs)


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    task = str(params.extra.get("workflow_task", "bench_noop"))
    n = f"{params.jobs:,}"
    plain = Figure(SCENARIO, "workflow.plain", f"{task} jobs/s without a workflow ({n} jobs)", "jobs/s")
    fan_in = Figure(SCENARIO, "workflow.fan_in", f"{task} children/s of a {n}-job fan-in", "jobs/s")
    ratio = Figure(
        SCENARIO, "workflow.ratio", "fan-in children / plain jobs, per repetition", "ratio", target=Target(">=", 0.8)
    )
    env = bench_env(database_url, box.redis_url, box.prefix)
    with psycopg.connect(database_url) as conn:
        for label, jobs in (("warm-up", min(WARMUP_JOBS, params.jobs)),):
            _reset(box, conn)
            _fan_in(conn, task, jobs)
            with children(env) as kids:
                _drain(kids, conn, params.concurrency, jobs + 1)
            progress.say(f"workflow {label} run done")
        for rep in range(params.repeat):
            _reset(box, conn)
            outbox.prefill(conn, task, params.jobs, params.batch)
            with children(env) as kids:
                if not _drain(kids, conn, params.concurrency, params.jobs):
                    plain.label += " [a run timed out]"
            plain.values.append(outbox.span(conn, CHILD_SPAN).rate)

            _reset(box, conn)
            _fan_in(conn, task, params.jobs)
            with children(env) as kids:
                if not _drain(kids, conn, params.concurrency, params.jobs + 1):
                    fan_in.label += " [a run timed out]"
            fan_in.values.append(outbox.span(conn, CHILD_SPAN).rate)
            callback = conn.execute(CALLBACK).fetchall()
            conn.commit()
            if callback != [("succeeded", 1)]:
                raise RuntimeError(f"the fan-in's callback should have run once: {callback}")
            ratio.values.append(fan_in.values[-1] / plain.values[-1])
            progress.say(
                f"workflow rep {rep + 1}/{params.repeat}: plain {plain.values[-1]:,.0f} jobs/s, fan-in"
                f" {fan_in.values[-1]:,.0f} children/s, ratio {ratio.values[-1]:.2f}, callback once"
            )
        _reset(box, conn)
    return [plain, fan_in, ratio]
