"""``bench worker``: no-op jobs/s end to end, and a worker's peak memory.

Each run: ``jobs`` no-op jobs are committed to the outbox first; then one relay
and 1 (or 2) worker processes start (``python -m postbox.relay run``, ``python -m
postbox.worker run --tasks postbox_bench.tasks --concurrency C``); the run ends when every
job has a recorded outcome.  The rate is taken from PostgreSQL's
``finished_at`` stamps (jobs after the first finished batch / time from the
first outcome to the last), so process start-up is not counted and the bench
costs the system nothing while it runs.  Variants: ``bench_noop`` with 1 and
2 worker processes, and ``bench_tx`` (``ctx.transaction()``) with 1.

Peak RSS is VmHWM of the (first) worker process, read from /proc just before
it is stopped, after the 1-process no-op run at ``--concurrency``.

One unmeasured warm-up drain (``WARMUP_JOBS`` no-op jobs, 1 process) comes
first: the first run on a new database otherwise pays for its catalogs, files
and server caches.  With peers, ``between(rep)`` runs each peer's repetition
right after postbox's 1-process no-op run of the same repetition.  With
``--floor``, each of those runs is also followed by the delivery contract's
shortest path draining as many jobs (:func:`postbox_bench.floor.drain`),
reported as system ``floor``, paired, and by the same path running each job's
no-op handler in an asyncio task of its own, as system ``floor-tasks``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from postbox_bench import outbox
from postbox_bench.machine import peak_rss_mb
from postbox_bench.params import Params
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import FLOOR, FLOOR_TASKS, Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.tasks import QUEUE

SCENARIO = "worker"
WARMUP_JOBS = 2_000


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    task: str
    processes: int
    target: Target | None = None


def variants(params: Params) -> list[Variant]:
    n = f"{params.jobs:,}"
    return [
        Variant("worker.noop_1p", f"no-op jobs/s, 1 worker process ({n} jobs)", "bench_noop", 1, Target(">=", 4000)),
        Variant("worker.noop_2p", f"no-op jobs/s, 2 worker processes ({n} jobs)", "bench_noop", 2),
        Variant("worker.tx_1p", f"ctx.transaction() jobs/s, 1 process ({n} jobs)", "bench_tx", 1),
    ]


def worker_argv(concurrency: int) -> list[str]:
    return [
        "postbox.worker",
        "run",
        "--tasks",
        "postbox_bench.tasks",
        "--queues",
        QUEUE,
        "--concurrency",
        str(concurrency),
    ]


def start_system(kids: Children, processes: int, concurrency: int) -> list[int]:
    """A relay and ``processes`` workers; returns the workers' pids."""
    kids.python("relay", ["postbox.relay", "run"])
    return [kids.python(f"worker{i}", worker_argv(concurrency)).pid for i in range(processes)]


def drain(conn: psycopg.Connection[Any], kids: Children, jobs: int) -> bool:
    """Wait until every job has an outcome; False if the deadline passed first (measure what finished)."""
    try:
        outbox.wait_until(
            lambda: outbox.scalar(conn, outbox.COUNT_UNFINISHED) == 0,
            timeout=max(120.0, jobs / 100),
            check=kids.check_alive,
        )
    except TimeoutError:
        return False
    found = outbox.states(conn)
    if found != {"succeeded": jobs}:
        raise RuntimeError(f"expected {jobs} succeeded jobs, found {found}")
    return True


def drain_once(
    box: Sandbox, conn: psycopg.Connection[Any], env: dict[str, str], variant: Variant, params: Params, jobs: int
) -> tuple[bool, float | None]:
    """One run of ``variant`` on ``jobs`` fresh jobs: (drained in time, peak RSS of the first worker)."""
    outbox.reset(conn)
    box.clean_redis_prefix()
    outbox.prefill(conn, variant.task, jobs, params.batch)
    with children(env) as kids:
        pids = start_system(kids, variant.processes, params.concurrency)
        complete = drain(conn, kids, jobs)
        peak = peak_rss_mb(pids[0])
    return complete, peak


def run(
    box: Sandbox,
    database_url: str,
    params: Params,
    progress: Progress,
    between: Callable[[int], None] | None = None,
) -> list[Figure]:
    chosen = variants(params)
    figures = {v.key: Figure(SCENARIO, v.key, v.label, "jobs/s", target=v.target) for v in chosen}
    rss = Figure(
        SCENARIO,
        "worker.rss",
        f"worker peak RSS at concurrency {params.concurrency}",
        "MB",
        target=Target("<=", 150),
        higher_is_better=False,
    )
    floors: list[tuple[Figure, bool]] = []  # (figure, handler tasks)
    if params.extra.get("floor"):  # the contract's shortest path, right after each 1-process no-op run
        noop = figures["worker.noop_1p"]
        for system, tasks in ((FLOOR, False), (FLOOR_TASKS, True)):
            floors.append((Figure(SCENARIO, noop.key, noop.label, "jobs/s", system=system, paired=True), tasks))
    env = bench_env(database_url, box.redis_url, box.prefix)
    with psycopg.connect(database_url) as conn:
        drain_once(box, conn, env, chosen[0], params, min(WARMUP_JOBS, params.jobs))
        progress.say("worker warm-up run done")
        for rep in range(params.repeat):
            for variant in chosen:
                complete, peak = drain_once(box, conn, env, variant, params, params.jobs)
                if not complete:
                    figures[variant.key].label += " [a run timed out: rate of the jobs finished]"
                    progress.say(f"worker rep {rep + 1} {variant.task}: not drained by the deadline")
                span = outbox.span(conn, outbox.FINISH_SPAN)
                figures[variant.key].values.append(span.rate)
                if variant.key == "worker.noop_1p" and peak is not None:
                    rss.values.append(peak)
                progress.say(
                    f"worker rep {rep + 1}/{params.repeat} {variant.task} x{variant.processes}: "
                    f"{span.rate:,.0f} jobs/s" + (f", peak RSS {peak:.0f} MB" if peak is not None else "")
                )
                if variant.key == "worker.noop_1p":
                    from postbox_bench import floor as shortest  # it imports this module

                    for floor, tasks in floors:
                        box.clean_redis_prefix()
                        floor.values.append(
                            shortest.drain(
                                database_url,
                                box.redis_url,
                                box.prefix,
                                params.jobs,
                                params.concurrency,
                                handler_tasks=tasks,
                            )
                        )
                        progress.say(
                            f"worker rep {rep + 1}/{params.repeat} the contract's floor"
                            f"{' with a task per handler' if tasks else ''}: {floor.values[-1]:,.0f} jobs/s"
                        )
                if variant.key == "worker.noop_1p" and between is not None:
                    between(rep)
        outbox.reset(conn)
    box.clean_redis_prefix()
    return [*figures.values(), rss, *(floor for floor, _tasks in floors)]
