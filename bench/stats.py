"""Numbers from samples: percentiles of latencies, median/min/max of repetitions.

Pure functions, no I/O: the scenarios collect raw samples and hand them here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks.

    Raises ValueError on an empty sample or a ``q`` outside 0-100.
    """
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0-100, got {q}")
    ordered = sorted(samples)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


@dataclass(frozen=True)
class Latency:
    """Percentiles of one run's latencies, in milliseconds."""

    p50: float
    p95: float
    p99: float
    count: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        ms = [s * 1000.0 for s in seconds]
        return cls(p50=percentile(ms, 50), p95=percentile(ms, 95), p99=percentile(ms, 99), count=len(ms))


@dataclass(frozen=True)
class Spread:
    """Median, min and max of one figure over repetitions."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        data = [float(v) for v in values]
        if not data:
            raise ValueError("no repetitions to aggregate")
        return cls(median=statistics.median(data), low=min(data), high=max(data), runs=len(data))

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": self.runs}


def rate(count: int, seconds: float) -> float:
    """Items per second; raises ValueError for a non-positive duration."""
    if seconds <= 0:
        raise ValueError(f"duration must be > 0, got {seconds}")
    return count / seconds
