"""The knobs of one bench invocation (``--jobs``, ``--concurrency``, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Params:
    jobs: int = 20_000  # jobs per worker-throughput run (and per bulk-enqueue run)
    relay_rows: int = 100_000  # pre-filled outbox for the relay throughput run
    concurrency: int = 50  # worker concurrency (handlers in flight per process)
    rates: tuple[int, ...] = (200, 1000)  # steady enqueue rates of the latency scenario (jobs/s)
    relay_rate: int = 500  # steady rate of the relay commit-to-XADD latency run (jobs/s)
    duration: float = 5.0  # seconds of each timed loop / steady-rate run
    repeat: int = 3
    batch: int = 10_000  # enqueue_many batch size
    peers: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "relay_rows": self.relay_rows,
            "concurrency": self.concurrency,
            "rates": "/".join(str(r) for r in self.rates),
            "relay_rate": self.relay_rate,
            "duration_s": self.duration,
            "repeat": self.repeat,
            "batch": self.batch,
        }
