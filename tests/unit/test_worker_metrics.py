"""The worker's own counter and histogram collectors expose what prometheus_client's would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from postbox.worker.metrics import DURATION_BUCKETS, LabelledCounter, LabelledHistogram, WorkerMetrics

VALUES = [0.0, 0.0004, 0.0005, 0.00051, 0.003, 0.7, 1.0, 299.0, 300.0, 301.0, 1e9]


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_histogram_samples_equal_prometheus_clients_for_the_same_observations() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LabelledHistogram("h_seconds", "doc", ["queue", "task"], DURATION_BUCKETS)
    ours.register(mine)
    reference = Histogram("h_seconds", "doc", ["queue", "task"], buckets=DURATION_BUCKETS, registry=theirs)
    for i, value in enumerate(VALUES):
        labels = ("q", "a" if i % 3 else "b")
        mine.observe(labels, value)
        reference.labels(*labels).observe(value)
    assert samples(ours) == samples(theirs)
    assert ours.get_sample_value("h_seconds_count", {"queue": "q", "task": "a"}) == 7
    assert ours.get_sample_value("h_seconds_bucket", {"queue": "q", "task": "b", "le": "0.0005"}) == 1
    assert ours.get_sample_value("h_seconds_bucket", {"queue": "q", "task": "a", "le": "0.0005"}) == 2
    assert ours.get_sample_value("h_seconds_bucket", {"queue": "q", "task": "a", "le": "+Inf"}) == 7


def test_counter_samples_equal_prometheus_clients() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LabelledCounter("jobs", "doc", ["queue", "outcome"])
    ours.register(mine)
    reference = Counter("jobs", "doc", ["queue", "outcome"], registry=theirs)
    for labels, amount in [(("q", "started"), 1), (("q", "started"), 3), (("r", "dead"), 1)]:
        mine.inc(labels, amount)
        reference.labels(*labels).inc(amount)
    assert samples(ours) == samples(theirs)
    assert ours.get_sample_value("jobs_total", {"queue": "q", "outcome": "started"}) == 4


def test_exposition_text_has_help_type_and_series() -> None:
    metrics = WorkerMetrics()
    metrics.count("q", "t", "started", 2)
    metrics.observe_latency("q", "t", 0.003)
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE postbox_worker_jobs_total counter" in text  # as prometheus_client writes a Counter
    assert 'postbox_worker_jobs_total{outcome="started",queue="q",task="t"} 2.0' in text
    assert "# TYPE postbox_worker_start_latency_seconds histogram" in text
    assert 'postbox_worker_start_latency_seconds_bucket{le="0.0025",queue="q",task="t"} 0.0' in text
    assert 'postbox_worker_start_latency_seconds_bucket{le="0.005",queue="q",task="t"} 1.0' in text
    assert 'postbox_worker_start_latency_seconds_count{queue="q",task="t"} 1.0' in text
    assert "postbox_worker_handler_seconds" in text  # declared even before its first observation


@pytest.mark.parametrize("buckets", [(), (1.0, 0.5), (0.5, 0.5), (1.0, float("inf"))])
def test_histogram_rejects_bad_buckets(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="buckets must be finite, distinct and ascending"):
        LabelledHistogram("h", "doc", ["q"], buckets)
