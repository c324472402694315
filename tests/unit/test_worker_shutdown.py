"""The worker process's shutdown deadlines (worker/shutdown.py), with a fake exit."""

from __future__ import annotations

import threading
import time

from postbox.worker.shutdown import EXIT_FORCED, ShutdownGuard


class FakeWorker:
    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


def test_a_worker_that_outlives_its_drain_deadline_is_ended() -> None:
    worker, exited = FakeWorker(), threading.Event()
    codes: list[int] = []
    guard = ShutdownGuard(worker, 0.1, grace=0.1, abort_grace=5, exit=lambda code: (codes.append(code), exited.set()))
    started = time.monotonic()
    guard.on_signal()
    assert exited.wait(5)
    assert codes == [EXIT_FORCED] and worker.stops == 1
    assert 0.2 <= time.monotonic() - started < 2


def test_a_second_signal_shortens_the_deadline() -> None:
    worker, exited = FakeWorker(), threading.Event()
    guard = ShutdownGuard(worker, 60, grace=10, abort_grace=0.1, exit=lambda code: exited.set())
    guard.on_signal()
    started = time.monotonic()
    guard.on_signal()
    assert exited.wait(5) and time.monotonic() - started < 2
    assert worker.stops == 2
    guard.cancel()


def test_no_forced_exit_when_cancelled() -> None:
    exited = threading.Event()
    guard = ShutdownGuard(FakeWorker(), 0.05, grace=0.05, exit=lambda code: exited.set())
    guard.on_signal()
    guard.cancel()
    assert not exited.wait(0.3)
