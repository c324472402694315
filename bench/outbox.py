"""The bench's reads and writes of the outbox: reset, pre-fill, wait, and timestamp spans.

Throughput is computed from PostgreSQL's own timestamps (``published_at``,
``finished_at``) rather than by polling counts during the run, so measuring
costs the measured system nothing: ``(rows after the first batch) / (last -
first timestamp)``.  Waiting for the end polls a cheap query a few times a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg

from postbox import enqueue_many

RESET: LiteralString = "TRUNCATE postbox.outbox, postbox.job_attempts, postbox.processed_jobs"
COUNT_UNPUBLISHED: LiteralString = (
    "SELECT count(*) FROM postbox.outbox WHERE published_at IS NULL AND state IN ('pending', 'retrying')"
)
COUNT_UNFINISHED: LiteralString = "SELECT count(*) FROM postbox.outbox WHERE finished_at IS NULL"
COUNT_BY_STATE: LiteralString = "SELECT state, count(*) FROM postbox.outbox GROUP BY state ORDER BY state"
PUBLISH_SPAN: LiteralString = """
SELECT min(published_at), max(published_at), count(*),
       count(*) FILTER (WHERE published_at = (SELECT min(published_at) FROM postbox.outbox))
  FROM postbox.outbox WHERE published_at IS NOT NULL
"""
FINISH_SPAN: LiteralString = """
SELECT min(finished_at), max(finished_at), count(*),
       count(*) FILTER (WHERE finished_at = (SELECT min(finished_at) FROM postbox.outbox))
  FROM postbox.outbox WHERE finished_at IS NOT NULL
"""


@dataclass(frozen=True)
class Span:
    seconds: float
    count: int  # rows in the span
    first: int  # rows stamped with the first timestamp (not counted in the rate)

    @property
    def rate(self) -> float:
        if self.seconds <= 0:
            return float("nan")
        return (self.count - self.first) / self.seconds


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute(RESET)
    conn.commit()


def prefill(conn: psycopg.Connection[Any], task: str, count: int, batch: int = 10_000) -> None:
    """``count`` jobs of ``task`` committed in batches (the relay sees them all at once when it starts)."""
    done = 0
    while done < count:
        size = min(batch, count - done)
        enqueue_many(conn, [{"task": task, "args": {"n": done + i}} for i in range(size)])
        done += size
    conn.commit()


def scalar(conn: psycopg.Connection[Any], query: LiteralString) -> int:
    row = conn.execute(query).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(COUNT_BY_STATE).fetchall()
    conn.commit()
    return {str(state): int(n) for state, n in rows}


def span(conn: psycopg.Connection[Any], query: LiteralString) -> Span:
    row = conn.execute(query).fetchone()
    conn.commit()
    if row is None or row[0] is None:
        return Span(0.0, 0, 0)
    return Span((row[1] - row[0]).total_seconds(), int(row[2]), int(row[3]))


def wait_until(
    done: Callable[[], bool], timeout: float, *, interval: float = 0.25, check: Callable[[], None] | None = None
) -> None:
    """Poll ``done`` until true; raise TimeoutError after ``timeout``. ``check`` raises if a child died."""
    deadline = time.monotonic() + timeout
    while not done():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout:.0f}s")
        time.sleep(interval)
