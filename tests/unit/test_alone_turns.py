"""The suite's turns (tests/harness/alone.py): an ``alone`` test waits for the running ones,
then runs with none beside it, and a test arriving meanwhile waits for it."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from tests.harness import alone
from tests.harness.wait import wait_until


def held(path: Path) -> bool:
    with path.open("ab") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_an_alone_test_runs_between_the_others_never_beside_them(tmp_path: Path) -> None:
    log: list[str] = []
    release_first = threading.Event()

    def run(name: str, is_alone: bool, hold: threading.Event | None = None) -> threading.Thread:
        def body() -> None:
            with alone.turn(is_alone, tmp_path):
                log.append(f"{name} in")
                if hold is not None:
                    hold.wait(30)
                log.append(f"{name} out")

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    first = run("first", False, release_first)
    wait_until(lambda: log == ["first in"], interval=0.005, message="the first test runs")
    lone = run("lone", True)
    wait_until(lambda: held(tmp_path / "gate"), interval=0.005, message="the alone test waits, holding the gate")
    later = run("later", False)
    assert log == ["first in"]  # neither the alone test nor the later one started beside the first
    release_first.set()
    for thread in (first, lone, later):
        thread.join(30)
    assert log == ["first in", "first out", "lone in", "lone out", "later in", "later out"]


def test_two_ordinary_tests_run_side_by_side(tmp_path: Path) -> None:
    both_in = threading.Barrier(2, timeout=30)

    def body() -> None:
        with alone.turn(False, tmp_path):
            both_in.wait()  # raises BrokenBarrierError if the second cannot enter beside the first

    threads = [threading.Thread(target=body) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    assert not both_in.broken


def test_nothing_is_locked_on_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    assert alone.lock_dir() is None
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abc")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    assert alone.lock_dir() is None
