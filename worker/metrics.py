"""Prometheus metrics of one worker process. Labels: queue, task, outcome only.

Each :class:`~postbox.worker.worker.Worker` gets its own registry (several workers may share a test
process); the CLI serves it on ``worker_metrics_port``.

The per-job series (job counts and the two histograms) are kept in plain
dicts and lists and exposed through a custom collector: prometheus_client's
own Counter and Histogram take a lock and run several Python calls per
observation, which cost a no-op job about 8 µs of the worker's ~45 µs
(docs/benchmarks.md). Only the event loop's thread writes these series; a
scrape, from the HTTP server's thread, copies them (a single C-level copy
under the GIL) before it renders them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
DURATION_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class LabelledCounter(Collector):
    """A counter per label tuple; exposed as ``<name>_total``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1) -> None:
        self._values[labels] = self._values.get(labels, 0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in list(self._values.items()):
            family.add_metric(labels, value)
        yield family


class LabelledHistogram(Collector):
    """Histogram series per label tuple: an observation is one bisect and two additions."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(set(bounds)) or not bounds or math.isinf(bounds[-1]):
            raise ValueError(f"{name}: buckets must be finite, distinct and ascending")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = tuple(bounds)
        self._les = [*(floatToGoString(b) for b in bounds), "+Inf"]
        # Per label tuple: one count per bucket (values <= that bound, not cumulative; +Inf last), then the sum.
        self._series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = [0.0] * (len(self._bounds) + 2)
        series[bisect_left(self._bounds, value)] += 1
        series[-1] += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in list(self._series.items()):
            counts = list(series)
            cumulative = 0.0
            buckets = []
            for le, count in zip(self._les, counts[:-1], strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(labels, buckets, sum_value=counts[-1])
        yield family


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # outcome: started, succeeded, retried, snoozed, dead, cancelled, expired, duplicate, skipped, lost, held
        self.jobs = LabelledCounter(
            "postbox_worker_jobs",
            "Job runs and deliveries by outcome (started, succeeded, retried, snoozed, dead, cancelled, expired,"
            " duplicate: effects already committed, skipped: delivery not run, lost: attempt superseded,"
            " held: held back by a concurrency or rate limit, published again when it may run).",
            ["queue", "task", "outcome"],
        )
        self.duration = LabelledHistogram(
            "postbox_worker_handler_seconds", "Handler run time.", ["queue", "task"], DURATION_BUCKETS
        )
        self.latency = LabelledHistogram(
            "postbox_worker_start_latency_seconds",
            "Enqueue commit to handler start.",
            ["queue", "task"],
            LATENCY_BUCKETS,
        )
        for collector in (self.jobs, self.duration, self.latency):
            self.registry.register(collector)
        self.in_flight = Gauge("postbox_worker_in_flight", "Jobs running now.", registry=self.registry)

    def count(self, queue: str, task: str, outcome: str, amount: int = 1) -> None:
        self.jobs.inc((queue, task, outcome), amount)

    def observe_duration(self, queue: str, task: str, seconds: float) -> None:
        self.duration.observe((queue, task), seconds)

    def observe_latency(self, queue: str, task: str, seconds: float) -> None:
        self.latency.observe((queue, task), seconds)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
