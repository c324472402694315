"""CPU per job, per role: ``python -m postbox_bench.cpu --task bench_noop --jobs 5000 --repeat 3``.

One relay and one worker process (``--concurrency``, default 50) on a fresh
sandbox; per repetition ``--jobs`` N jobs of ``--task`` are inserted in one
transaction while both are up and idle, committed at once, and drained (every
job succeeded). Each role's CPU time (all threads' scheduler nanoseconds from
``/proc/<pid>/task/*/schedstat``) from just before the commit to the drain's
end, divided by N:

- ``worker``, ``relay``: the two postbox processes;
- ``pg``: every PostgreSQL backend of the sandbox database except the bench's own
  (the worker's pool, the relay's connections);
- ``redis``: the redis-server process (all its threads; the sandbox's Redis
  database is the only one the bench drives, other clients of the server count too).

With ``--rate R`` the jobs are committed one per transaction at R jobs/s
(``bench latency``'s producer) while the relay and worker run: each job wakes
them on its own, so the figures are the low-rate cost per job (wake-ups,
reads, claims, outcomes and acknowledgements of one or two jobs at a time).
With ``--spread`` the jobs go round robin over 100 queues x 10 priorities (the
many-queues shape of ``postbox-bench growth --growth queues``) and the worker
consumes all of them: the per-stream costs of reading, waking and
acknowledging show up against the one-queue figures.

With ``--floor`` the relay and worker are the delivery contract's shortest
path (:mod:`postbox_bench.floor`, reading ``--concurrency`` entries at a time;
with ``bench_effect``, its ``effect`` worker keeping as many jobs in flight)
instead of postbox's: the same roles, for ``bench_noop`` and ``bench_effect``
(``--driver asyncpg``: the effect worker's transactions on asyncpg; ``--handler-tasks``: the no-op
floor's worker running each job's handler in a task of its own).

Each line ends with the drain's rate (first to last finish) and how many cores
all roles kept busy over it (their CPU seconds per second of the drain): a
drain that keeps fewer cores busy than the machine has waits on round trips,
not on CPU.

CPU time is what a process used, not how long it waited for a core, so these
figures hold on a loaded machine where jobs/s do not. Run it twice with
``PYTHONPATH`` pointing at two copies of the ``postbox`` package to compare
code, alternating (A B A B) so drift hits both.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any, LiteralString

import psycopg
import redis as syncredis

from postbox import enqueue_many
from postbox_bench import floor as shortest
from postbox_bench import growth, outbox
from postbox_bench import worker as bench_worker
from postbox_bench.flow import FORGET_WORKERS, wait_registered
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.sandbox import sandbox
from postbox_bench.schedules import LEADS, cpu_seconds
from postbox_bench.steady import produce
from postbox_bench.tasks import EFFECTS_DDL

BACKENDS: LiteralString = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
ROLES = ("worker", "relay", "pg", "redis")
CORES = "cores"  # beside the roles in each result: CPU seconds of all roles per second of the drain
RATE = "jobs/s"  # and the drain's rate, first to last finish (as bench worker's)


def _backends(conn: psycopg.Connection[Any]) -> dict[int, float]:
    pids = [row[0] for row in conn.execute(BACKENDS).fetchall()]
    conn.commit()
    out: dict[int, float] = {}
    for pid in pids:
        try:
            out[pid] = cpu_seconds(pid)
        except OSError:
            continue
    return out


def _py_spy(pid: int, path: str) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` at 500 Hz into ``path`` (collapsed stacks), until SIGINT."""
    argv = ["py-spy", "record", "-p", str(pid), "-r", "500", "-f", "raw", "-o", path, "--nonblocking"]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the jobs commit
    return spy


def _redis_pid(url: str) -> int | None:
    client = syncredis.Redis.from_url(url)
    try:
        info = client.info("server")
    finally:
        client.close()
    pid = int(info.get("process_id", 0))
    return pid if pid and os.path.exists(f"/proc/{pid}") else None


def _start_floor(
    kids: Children, conn: psycopg.Connection[Any], url: str, redis_url: str, prefix: str, batch: int, mode: str
) -> tuple[int, int]:
    """The floor's relay and worker, waited for until both are connected and the worker reads; their pids."""
    relay, worker = shortest.start_floor(kids, url, redis_url, prefix, "", mode, batch)
    client = syncredis.Redis.from_url(redis_url)

    def reading() -> bool:
        blocked = any(c.get("cmd") == "xreadgroup" for c in client.client_list())  # the worker waits in its read
        sessions = len(_backends(conn))
        conn.rollback()  # pg_stat_activity is read once per transaction
        # the relay's two and the worker's two, or its claims' and its transactions' (the effect worker)
        return blocked and sessions >= (4 if mode in ("floor", shortest.TASKS) else 3 + min(batch, 20))

    try:
        outbox.wait_until(reading, 60, check=kids.check_alive)
    finally:
        client.close()
    return relay, worker


def measure(
    task: str,
    jobs: int,
    repeat: int,
    concurrency: int,
    worker_env: dict[str, str],
    profile: str | None = None,
    *,
    profile_role: str = "worker",
    spread: bool = False,
    rate: float | None = None,
    floor: bool = False,
    driver: str = "psycopg",
    handler_tasks: bool = False,
) -> list[dict[str, float]]:
    """``repeat`` drains of ``jobs`` jobs: each a dict role -> µs of CPU per job.

    ``handler_tasks``: with ``floor`` and ``bench_noop``, the floor's worker that runs each job's handler in a
    task of its own (:data:`postbox_bench.floor.TASKS`).
    """
    database_url = os.environ["POSTBOX_DATABASE_URL"]
    redis_url = os.environ["POSTBOX_REDIS_URL"]
    results: list[dict[str, float]] = []
    with sandbox(database_url, redis_url) as box:
        url = box.database()
        env = bench_env(url, box.redis_url, box.prefix)
        redis_pid = _redis_pid(box.redis_url)
        with psycopg.connect(url) as conn:
            conn.execute(EFFECTS_DDL)  # bench_effect's table
            conn.commit()
            for _ in range(repeat):
                outbox.reset(conn)
                conn.execute("TRUNCATE public.bench_effects")
                conn.execute(FORGET_WORKERS)
                conn.commit()
                box.clean_redis_prefix()
                with children(env) as kids:
                    if floor:
                        effect = shortest.EFFECT_ASYNCPG if driver == "asyncpg" else shortest.EFFECT
                        mode = effect if task == "bench_effect" else shortest.TASKS if handler_tasks else "floor"
                        relay, worker = _start_floor(kids, conn, url, box.redis_url, box.prefix, concurrency, mode)
                    else:
                        relay = kids.python("relay", ["postbox.relay", "run"]).pid
                        argv = (
                            growth.worker_argv(concurrency, growth.QUEUES)
                            if spread
                            else bench_worker.worker_argv(concurrency)
                        )
                        worker = kids.python("worker", argv, worker_env).pid
                        wait_registered(conn, kids, [worker])
                        outbox.wait_until(lambda: outbox.scalar(conn, LEADS) == 1, 60, check=kids.check_alive)
                    where = growth.spread if spread else (lambda _i: {})
                    if rate is None:
                        enqueue_many(conn, [{"task": task, "args": {"n": i}, **where(i)} for i in range(jobs)])
                    pg_before = _backends(conn)
                    before = {"worker": cpu_seconds(worker), "relay": cpu_seconds(relay)}
                    before["redis"] = cpu_seconds(redis_pid) if redis_pid else 0.0
                    sampled = relay if profile_role == "relay" else worker
                    spy = _py_spy(sampled, f"{profile}.{len(results) + 1}") if profile else None
                    conn.commit()
                    released = time.monotonic()
                    if rate is not None:  # one job per transaction, on schedule (the producers' backends
                        # have ended when the drain does: they are not counted)
                        produce(url, task, rate, jobs / rate, where if spread else None)
                    try:
                        if not bench_worker.drain(conn, kids, jobs):
                            raise RuntimeError(f"{jobs} jobs not drained in time")
                    finally:
                        if spy is not None:
                            spy.send_signal(signal.SIGINT)
                            spy.wait(30)
                    used = {
                        "worker": cpu_seconds(worker) - before["worker"],
                        "relay": cpu_seconds(relay) - before["relay"],
                    }
                    used["redis"] = cpu_seconds(redis_pid) - before["redis"] if redis_pid else 0.0
                    used["pg"] = sum(v - pg_before.get(pid, 0.0) for pid, v in _backends(conn).items())
                    wall = time.monotonic() - released
                row = {role: used[role] / jobs * 1e6 for role in ROLES}
                # How busy the machine was: all roles' CPU over the drain's wall time (2.0 = both cores of
                # this machine). Under it a drain waits on round trips, not on CPU.
                row[CORES] = sum(used.values()) / wall if wall > 0 else 0.0
                row[RATE] = outbox.span(conn, outbox.FINISH_SPAN).rate
                results.append(row)
            outbox.reset(conn)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m postbox_bench.cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="bench_noop")
    p.add_argument("--jobs", type=int, default=5_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE", help="extra worker environment")
    p.add_argument("--profile", metavar="PATH", help="py-spy a process: collapsed stacks to PATH.<rep>")
    p.add_argument("--profile-role", choices=("worker", "relay"), default="worker", help="what --profile samples")
    p.add_argument("--spread", action="store_true", help="jobs over 100 queues x 10 priorities, one worker on all")
    p.add_argument("--rate", type=float, help="commit the jobs one by one at this rate (jobs/s) instead of at once")
    p.add_argument(
        "--floor", action="store_true", help="the contract's shortest path instead (bench_noop or bench_effect)"
    )
    p.add_argument(
        "--handler-tasks",
        action="store_true",
        help="with --floor --task bench_noop: the floor's worker runs each job's no-op handler in a task of its own",
    )
    p.add_argument(
        "--driver",
        choices=("psycopg", "asyncpg"),
        default="psycopg",
        help="with --floor --task bench_effect: the jobs' transactions on this driver's connections",
    )
    args = p.parse_args(argv)
    if args.floor and (args.task not in ("bench_noop", "bench_effect") or args.spread):
        p.error("--floor runs bench_noop or bench_effect on one queue (no --spread)")
    if args.handler_tasks and not (args.floor and args.task == "bench_noop"):
        p.error("--handler-tasks is the no-op floor's: it needs --floor --task bench_noop")
    if args.driver != "psycopg" and not (args.floor and args.task == "bench_effect"):
        p.error("--driver asyncpg is the floor's: it needs --floor --task bench_effect")
    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    for index, row in enumerate(
        measure(
            args.task,
            args.jobs,
            args.repeat,
            args.concurrency,
            worker_env,
            args.profile,
            profile_role=args.profile_role,
            spread=args.spread,
            rate=args.rate,
            floor=args.floor,
            driver=args.driver,
            handler_tasks=args.handler_tasks,
        ),
        1,
    ):
        total = sum(row[role] for role in ROLES)
        cells = "  ".join(f"{role} {row[role]:7.1f}" for role in ROLES)
        print(
            f"{args.task} rep {index}: µs CPU/job  {cells}  total {total:7.1f}"
            f"  | {row[RATE]:,.0f} jobs/s, {row[CORES]:.2f} cores busy",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
