"""Test signals: optional queues a worker fills when it has done something.

In production every field is ``None`` and costs nothing. A test sets the ones
it needs and awaits them with a deadline instead of sleeping and hoping.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass
class WorkerSignals:
    claimed: asyncio.Queue[list[int]] | None = None  # job ids whose attempt this worker claimed
    started: asyncio.Queue[int] | None = None  # a handler started
    finished: asyncio.Queue[tuple[int, str]] | None = None  # (job id, outcome) once recorded and acknowledged
    skipped: asyncio.Queue[int] | None = None  # a delivery acknowledged without running
    reclaimed: asyncio.Queue[list[int]] | None = None  # job ids taken over from idle entries
    lost: asyncio.Queue[list[int]] | None = None  # jobs made republishable after their entry vanished
    held: asyncio.Queue[int] | None = None  # a job held back by a limit (acknowledged, published again later)
    released: asyncio.Queue[int] | None = None  # slots released after outcomes: how many parked jobs were woken


def fire(queue: asyncio.Queue[T] | None, value: T) -> None:
    if queue is not None:
        queue.put_nowait(value)
