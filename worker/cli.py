"""``postbox worker run [--tasks m1,m2] [--queues q1,q2] [--concurrency N]``.

Flags override the matching settings (``POSTBOX_TASKS``, ``POSTBOX_QUEUES``,
``POSTBOX_CONCURRENCY``). SIGTERM/SIGINT stop reading and drain in-flight jobs
for up to ``POSTBOX_DRAIN_TIMEOUT`` seconds; the process then exits 0. A second
signal ends the drain at once (unfinished jobs stay unacknowledged). Whatever
happens, the process ends within the drain timeout plus 10 s after the first
signal, 2 s after the second (``worker/shutdown.py``; exit status 3 if forced).

``--processes N`` (``POSTBOX_WORKER_PROCESSES``, default 1): above 1 this process is a supervisor
that runs N such worker processes, forwards SIGTERM/SIGINT to them, restarts one that dies and exits
2 when one reports a configuration error (``worker/supervisor.py``). With 1, nothing changes: this
process is the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from postbox import encryption
from postbox.errors import SchemaOutdatedError, SettingsError, TaskModuleError
from postbox.registry import load_task_modules
from postbox.settings import Settings
from postbox.startup import process_settings, run_loop, settle_collector


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="postbox worker", description="Consume jobs and run their handlers.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a worker process until SIGTERM/SIGINT")
    run.add_argument("--tasks", help="comma-separated modules whose @task handlers are loaded (POSTBOX_TASKS)")
    run.add_argument("--queues", help="comma-separated queues to consume; default: the loaded tasks' queues")
    run.add_argument("--concurrency", type=int, help="jobs run at once (POSTBOX_CONCURRENCY, default 10)")
    run.add_argument(
        "--processes",
        type=int,
        help="worker processes run under one supervisor (POSTBOX_WORKER_PROCESSES, default 1)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    settings = process_settings(
        "worker", tasks=args.tasks, queues=args.queues, concurrency=args.concurrency, worker_processes=args.processes
    )
    if settings is None:
        return 2
    if settings.worker_processes > 1:
        return supervise_workers(args, settings)
    # A stop signal while starting (importing task modules, connecting) is kept
    # and honoured once the event loop's handlers are in place.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    try:
        load_task_modules(settings.tasks)
    except TaskModuleError as exc:
        print(f"{exc.details}\npostbox worker: {exc}", file=sys.stderr)
        return 2

    from postbox.worker.shutdown import ShutdownGuard
    from postbox.worker.worker import Worker

    try:
        worker = Worker(settings)
    except SettingsError as exc:
        print(f"postbox worker: {exc}", file=sys.stderr)
        return 2
    keyless = encryption.keyless_warning(
        [spec.name for spec in map(worker.registry.get, worker.registry.names()) if spec.encrypted
         and spec.queue in worker.queues]
    )  # fmt: skip
    if keyless is not None:
        logging.getLogger(__name__).warning(keyless)

    async def serve() -> None:
        from postbox import revision, schedule_store
        from postbox.periodic import default_schedules
        from postbox.registry import default_registry

        # Signals first: a SIGTERM while starting (the schedules' sync waits on the
        # database) stops the worker cleanly, as one later does.
        loop = asyncio.get_running_loop()
        guard = ShutdownGuard(worker, settings.drain_timeout)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, guard.on_signal)
        for _ in early:
            guard.on_signal()
        # A schema older than this code: refuse before the schedules' sync writes anything.
        await revision.require_at(settings.require_database_url())
        # Periodic jobs follow the code: this worker's tasks' schedules (docs/periodic-jobs.md).
        await schedule_store.sync_at_start(settings.require_database_url(), default_schedules, default_registry)
        if settings.worker_metrics_port:
            worker.metrics.serve(settings.worker_metrics_port)
        settle_collector(settings.gc_threshold)
        await worker.run()  # the guard's deadline stands until the process has exited

    try:
        run_loop(serve())
    except SchemaOutdatedError as exc:
        print(f"postbox worker: {exc}", file=sys.stderr)
        return 2
    return 0


def supervise_workers(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``settings.worker_processes`` worker processes under this one (``worker/supervisor.py``)."""
    from postbox.worker.supervisor import Command, supervise

    processes = settings.worker_processes
    port = settings.worker_metrics_port
    if port and port + processes - 1 > 65535:
        print(
            f"postbox worker: POSTBOX_WORKER_METRICS_PORT: {processes} processes serve metrics on ports "
            f"{port} to {port + processes - 1}, past 65535",
            file=sys.stderr,
        )
        return 2
    argv = [sys.executable, "-m", "postbox.worker", "run"]
    for flag in ("tasks", "queues", "concurrency"):
        value = getattr(args, flag)
        if value is not None:
            argv += [f"--{flag}", str(value)]

    base = {**os.environ, "POSTBOX_WORKER_PROCESSES": "1"}
    # The children run ``python -m postbox.worker``: they import from the working directory, where this
    # process imported from its script's folder (``python /srv/shop/manage.py postbox worker run``).
    home = sys.path[0] if sys.path else ""
    if home and os.path.abspath(home) != os.getcwd():
        base["PYTHONPATH"] = os.pathsep.join(part for part in (home, os.environ.get("PYTHONPATH", "")) if part)

    def command(slot: int) -> Command:
        env = dict(base)
        if port:
            env["POSTBOX_WORKER_METRICS_PORT"] = str(port + slot)
        return Command(argv, env)

    return supervise(processes, command)
