"""A producer at a steady rate: one job per transaction, commit times recorded.

Open loop: job ``i`` is due at ``start + i / rate``; a producer that falls
behind catches up without waiting, so a slow consumer cannot slow the offered
load down (and hide its own latency).  The commit time of a job is
``time.time()`` right after COMMIT returned — the moment the producer knows
the job exists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from jobs import enqueue


@dataclass
class Produced:
    commits: dict[int, float] = field(default_factory=dict)  # job id -> commit time (epoch seconds)
    seconds: float = 0.0

    @property
    def achieved_rate(self) -> float:
        return len(self.commits) / self.seconds if self.seconds > 0 else float("nan")


def produce(conn: psycopg.Connection[Any], task: str, rate: float, seconds: float) -> Produced:
    out = Produced()
    total = max(1, int(rate * seconds))
    interval = 1.0 / rate
    start = time.perf_counter()
    for i in range(total):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        job_id = enqueue(conn, task, {"n": i})
        conn.commit()
        out.commits[job_id] = time.time()
    out.seconds = time.perf_counter() - start
    return out
