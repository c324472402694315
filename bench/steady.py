"""A producer at a steady rate: one job per transaction, commit times recorded.

Open loop: job ``i`` is due at ``start + i / rate``; a producer that falls
behind catches up without waiting, so a slow consumer cannot slow the offered
load down (and hide its own latency).  Jobs are spread over a few producer
connections (each its own thread), so a slow COMMIT on a busy machine delays
one job, not the schedule.  The commit time of a job is ``time.time()`` right
after its statement returned — the moment the producer knows the job exists.

Each job is one statement on an autocommit connection, as the peers' producers
enqueue (PgQueuer's ``Queries.enqueue`` is one statement, committed by
itself): an application enqueueing in its own transaction pays the COMMIT for
its own rows, and the bench's producer has none. With an explicit COMMIT after
each INSERT the producer spent 430-500 µs of CPU per job at 1,000 jobs/s on the
2-vCPU machine (docs/benchmarks.md, seventeenth round), against PgQueuer's
~200, and the measured system shared the two cores with the difference.

The producer's own cyclic garbage collector is held off while it paces
(:func:`without_gc_pauses`): a full collection in the bench process (40 ms
once its heap has grown) held a dozen due commits back, and they then went
out together, a burst the measured system never made. At 200 jobs/s for 5 s
those dozen jobs were the p99, whenever the collection fell in the run.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from postbox import enqueue


@dataclass
class Produced:
    commits: dict[int, float] = field(default_factory=dict)  # job id -> commit time (epoch seconds)
    seconds: float = 0.0

    @property
    def achieved_rate(self) -> float:
        return len(self.commits) / self.seconds if self.seconds > 0 else float("nan")


@contextlib.contextmanager
def without_gc_pauses() -> Iterator[None]:
    """The collector run once now, then held off until the block ends (a producer's few seconds)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def producers_for(rate: float) -> int:
    """Producer connections for a rate: one per 125 jobs/s, 2 to 16."""
    return max(2, min(16, math.ceil(rate / 125)))


def produce(
    database_url: str,
    task: str,
    rate: float,
    seconds: float,
    options: Callable[[int], Mapping[str, Any]] | None = None,
) -> Produced:
    """Commit ``rate * seconds`` jobs of ``task`` on schedule, spread over a few connections.

    ``options(i)``: enqueue options of job ``i`` (queue, priority, ...); none by default.
    """
    with without_gc_pauses():
        return _produce(database_url, task, rate, seconds, options)


def _produce(
    database_url: str,
    task: str,
    rate: float,
    seconds: float,
    options: Callable[[int], Mapping[str, Any]] | None,
) -> Produced:
    out = Produced()
    total = max(1, int(rate * seconds))
    lanes = producers_for(rate)
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.05

    def lane(index: int) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as own:
                for i in range(index, total, lanes):
                    delay = start + i / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    job_id = enqueue(own, task, {"n": i}, **(options(i) if options is not None else {}))
                    committed = time.time()
                    with lock:
                        out.commits[job_id] = committed
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(i,), daemon=True) for i in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return out
