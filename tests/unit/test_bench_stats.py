"""Percentiles, spreads and rates of the bench (pure)."""

from __future__ import annotations

import pytest

from postbox_bench.outbox import Span
from postbox_bench.stats import Latency, Spread, percentile, rate


def test_percentile_interpolates_between_closest_ranks() -> None:
    samples = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert percentile(samples, 0) == 10.0
    assert percentile(samples, 50) == 30.0
    assert percentile(samples, 100) == 50.0
    assert percentile(samples, 25) == 20.0
    assert percentile(samples, 90) == pytest.approx(46.0)
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # unsorted input is sorted first


def test_percentile_of_one_sample_is_that_sample() -> None:
    assert percentile([7.5], 99) == 7.5


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_rejects_out_of_range(q: float) -> None:
    with pytest.raises(ValueError, match="within 0-100"):
        percentile([1.0], q)


def test_percentile_rejects_empty() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_latency_is_in_milliseconds() -> None:
    lat = Latency.of([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert lat.count == 100
    assert lat.p50 == pytest.approx(50.5)
    assert lat.p95 == pytest.approx(95.05)
    assert lat.p99 == pytest.approx(99.01)


def test_spread_is_median_min_max() -> None:
    spread = Spread.of([3.0, 1.0, 2.0])
    assert (spread.median, spread.low, spread.high, spread.runs) == (2.0, 1.0, 3.0, 3)
    assert Spread.of([1.0, 4.0]).median == 2.5
    assert spread.as_dict() == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": 3}


def test_spread_of_nothing_raises() -> None:
    with pytest.raises(ValueError, match="no repetitions"):
        Spread.of([])


def test_rate() -> None:
    assert rate(500, 0.25) == 2000.0
    with pytest.raises(ValueError):
        rate(1, 0)


def test_span_rate_leaves_out_the_first_batch() -> None:
    # 10,000 rows, the first batch of 1,000 all stamped at t0, the last at t0 + 2 s
    assert Span(seconds=2.0, count=10_000, first=1_000).rate == 4_500.0
    assert Span(seconds=0.0, count=5, first=5).rate != Span(seconds=0.0, count=5, first=5).rate  # NaN
