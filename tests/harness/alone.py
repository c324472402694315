"""Tests marked ``alone`` run with no other test beside them, when the suite runs on several processes.

``make test`` runs the suite on two pytest-xdist processes: most tests spend
their time waiting on PostgreSQL, Redis and poll intervals, so two of them fit on
two cores. A test that measures time (a rate, a hand-off, a latency bound) would
measure its neighbour too: it is marked ``@pytest.mark.alone`` and, while it
runs, the other processes wait before their next test.

Two lock files shared by the run's processes (fcntl, so a crashed process lets
go of its locks): every test holds ``suite`` shared while it runs; an ``alone``
test holds it exclusively. ``gate`` gives the waiting ``alone`` test its turn:
a test passes through it before taking ``suite``, and an ``alone`` test holds it
while it waits and runs, so the other process cannot keep ``suite`` shared
forever by starting test after test.

Under one process (``-n 0``, or a plain ``pytest`` on a file) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

MARKER = "alone"


def lock_path(run: str) -> Path:
    """The folder of run ``run``'s lock files (the xdist test run's id)."""
    return Path(tempfile.gettempdir()) / f"postbox-tests-{run}"


def lock_dir() -> Path | None:
    """Where this run's lock files live; None when the suite runs on one process."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run or int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return None
    path = lock_path(run)
    path.mkdir(exist_ok=True)
    return path


def remove(run: str) -> None:
    """Remove run ``run``'s lock files (by the controlling process, once its workers are gone)."""
    shutil.rmtree(lock_path(run), ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[IO[bytes]]:
    with path.open("ab") as handle:
        fcntl.flock(handle, mode)
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def turn(alone: bool, where: Path | None = None) -> Iterator[None]:
    """Hold this test's turn: shared beside other tests, or exclusive when ``alone``."""
    where = where if where is not None else lock_dir()
    if where is None:
        yield
        return
    gate, suite = where / "gate", where / "suite"
    if alone:
        with _locked(gate, fcntl.LOCK_EX), _locked(suite, fcntl.LOCK_EX):
            yield
        return
    with _locked(gate, fcntl.LOCK_EX):
        shared = suite.open("ab")
        fcntl.flock(shared, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(shared, fcntl.LOCK_UN)
        shared.close()
