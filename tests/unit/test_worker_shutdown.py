"""The worker process's shutdown deadlines (worker/shutdown.py), with a fake exit."""

from __future__ import annotations

import asyncio
import threading
import time

from postbox.worker.shutdown import EXIT_FORCED, ShutdownGuard, cancel_all


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


def test_cancel_all_ends_a_task_that_lost_its_first_cancel() -> None:
    """A loop-until-cancelled task whose first cancel a library swallowed ends at the second."""
    seen: list[str] = []

    async def polls_until_cancelled() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)  # e.g. a pool's wait for a connection on Python 3.11
            except asyncio.CancelledError:
                if not seen:
                    seen.append("swallowed")
                    continue
                seen.append("ended")
                raise

    async def plain() -> None:
        await asyncio.Event().wait()

    async def run() -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(polls_until_cancelled()), asyncio.create_task(plain())]
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_all(tasks, recancel_after=0.05), 10)
        return tasks

    tasks = asyncio.run(run())
    assert seen == ["swallowed", "ended"]
    assert all(task.cancelled() for task in tasks)


def test_cancel_all_of_ended_tasks_returns_their_outcomes_untouched() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def run() -> asyncio.Task[None]:
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await cancel_all([task])
        return task

    task = asyncio.run(run())
    assert not task.cancelled() and isinstance(task.exception(), ValueError)
