"""cancel_all (postbox/cancellation.py): every task ends, even one that lost a cancel."""

from __future__ import annotations

import asyncio

from postbox.cancellation import cancel_all


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
