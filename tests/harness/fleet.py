"""Real relay and worker processes for the system tests.

A :class:`Fleet` starts ``python -m postbox.relay run``, ``python -m postbox.worker run`` (and the API or
any other child) on the test's servers, each writing to its own log file in the test's directory, and
kills every one of them (SIGCONT first, for a stopped one) on close, whatever the test did to them.
:func:`child` is the gentler one-process form: SIGTERM on exit, SIGKILL only past a deadline.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Self

import psycopg
import pytest

VISIBILITY = 2.0
# The worker tests' handlers and their queue (tests.harness.tasks.worker.QUEUE), named here without
# importing them: importing a tasks module registers its handlers in this process.
WORKER_TASKS = "tests.harness.tasks.worker"
WORKER_QUEUE = "wtest"

# Short leases: a lost worker's jobs are taken over within seconds.
LEASES = {"POSTBOX_VISIBILITY_TIMEOUT": str(VISIBILITY), "POSTBOX_HEARTBEAT_INTERVAL": "0.5"}
# Short retry back-off: a failed attempt runs again at once.
QUICK_RETRIES = {"POSTBOX_RETRY_BASE_DELAY": "0.05", "POSTBOX_RETRY_MAX_DELAY": "0.2"}
# What a fleet runs with unless told otherwise.
DEFAULT_SETTINGS = {**LEASES, **QUICK_RETRIES, "POSTBOX_DRAIN_TIMEOUT": "10"}


class Fleet:
    """Child processes of one test, each with its own log file; all killed on close.

    ``settings`` (``POSTBOX_*`` variables) go over ``env`` for every child. :meth:`worker` runs the
    handlers of the module ``tasks`` (or those ``POSTBOX_TASKS`` names, when ``tasks`` is None) on
    ``queue``, with ``--concurrency`` unless ``concurrency`` is None (then the setting's). :meth:`logs`
    keeps the last ``log_tail`` characters of each log (all of it when None).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_dir: Path,
        *,
        settings: Mapping[str, str] = DEFAULT_SETTINGS,
        tasks: str | None = WORKER_TASKS,
        queue: str = WORKER_QUEUE,
        concurrency: int | None = 1,
        log_tail: int | None = 3000,
    ) -> None:
        self.env = {**env, **settings}
        self.log_dir = log_dir
        self.tasks = tasks
        self.queue = queue
        self.concurrency = concurrency
        self.log_tail = log_tail
        self.procs: list[subprocess.Popen[bytes]] = []
        self._files: list[IO[bytes]] = []

    def start(self, *argv: str, name: str, **env: str) -> subprocess.Popen[bytes]:
        """``python *argv`` with the fleet's environment (and ``env`` over it), logging to ``<name>-<n>.log``."""
        log = open(self.log_dir / f"{name}-{len(self.procs)}.log", "wb")
        self._files.append(log)
        proc = subprocess.Popen([sys.executable, *argv], env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def relay(self) -> subprocess.Popen[bytes]:
        return self.start("-m", "postbox.relay", "run", name="relay")

    def worker(self, concurrency: int | None = None, **env: str) -> subprocess.Popen[bytes]:
        argv = ["-m", "postbox.worker", "run"]
        if self.tasks is not None:
            argv += ["--tasks", self.tasks]
        argv += ["--queues", self.queue]
        concurrency = self.concurrency if concurrency is None else concurrency
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        return self.start(*argv, name="worker", **env)

    def api(self, port: int) -> subprocess.Popen[bytes]:
        return self.start("-m", "postbox.app", "api", "run", "--host", "127.0.0.1", "--port", str(port), name="api")

    def postbox(self, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        """One ``postbox`` command to its end (two minutes at most), its output captured."""
        return subprocess.run(
            [sys.executable, "-m", "postbox.app", *argv],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def close(self) -> None:
        kill(self.procs)
        for log in self._files:
            log.close()

    def logs(self) -> str:
        tail = self.log_tail
        texts = (p.read_text(errors="replace") for p in sorted(self.log_dir.glob("*.log")))
        return "\n".join(text if tail is None else text[-tail:] for text in texts)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kill(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each process still running (SIGCONT first, in case it is stopped) and reap it."""
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


@contextmanager
def child(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python *argv`` logging to ``log``; on exit SIGTERM, and SIGKILL if it has not ended in 20 s."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, *argv], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """The first column of the first row, or None."""
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def worker_id_of(conn: psycopg.Connection[Any], proc: subprocess.Popen[bytes]) -> str | None:
    """The id a running worker process registered, None until it has."""
    return one(conn, "SELECT id FROM postbox.workers WHERE pid = %s AND stopped_at IS NULL", (proc.pid,))


@pytest.fixture
def fleet(child_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    """A :class:`Fleet` with the defaults (the worker tests' tasks, short leases), every process killed after."""
    with Fleet(child_env, tmp_path) as procs:
        yield procs


@pytest.fixture(name="db")
def effects_db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database holding the worker tests' effects table."""
    from tests.harness.tasks import worker as t  # imported when used: importing it registers its handlers

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(t.EFFECTS_DDL)
        yield conn
