"""Stopping background tasks: :func:`cancel_all` cancels until they have ended.

One cancel is not sure to end a task that loops until it is cancelled: a library
can lose it (see :func:`cancel_all`). Every process stops its loop tasks with it:
the worker's background tasks, the relay's listeners and pruning, the API's event
hub and load shedder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

RECANCEL_AFTER = 0.5  # seconds a cancelled task may take before it is cancelled again


async def cancel_all(tasks: Iterable[asyncio.Future[Any]], *, recancel_after: float = RECANCEL_AFTER) -> None:
    """Cancel ``tasks`` and wait for them all, cancelling again any still running after ``recancel_after`` s.

    One cancel is not sure to end a task that loops until it is cancelled: a library can
    lose it. On Python 3.11, ``asyncio.wait_for`` returns a result that arrives together
    with the cancel and drops the cancel, and psycopg_pool waits for a free connection
    that way. A worker stopped while starting (its pool still opening connections) then
    kept its control task polling until the shutdown deadline forced the process out
    (exit status 3 after 40 s).
    """
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_after)
    await asyncio.gather(*tasks, return_exceptions=True)
