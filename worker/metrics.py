"""Prometheus metrics of one worker process. Labels: queue, task, outcome only.

Each :class:`Worker` gets its own registry (several workers may share a test
process); the CLI serves it on ``worker_metrics_port``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
DURATION_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # outcome: started, succeeded, retried, dead, cancelled, expired, duplicate, skipped, lost
        self.jobs = Counter(
            "postbox_worker_jobs",
            "Job runs and deliveries by outcome (started, succeeded, retried, dead, cancelled, expired,"
            " duplicate: effects already committed, skipped: delivery not run, lost: attempt superseded).",
            ["queue", "task", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "postbox_worker_handler_seconds",
            "Handler run time.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "postbox_worker_start_latency_seconds",
            "Enqueue commit to handler start.",
            ["queue", "task"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge("postbox_worker_in_flight", "Jobs running now.", registry=self.registry)
        self._children: dict[tuple[str, ...], Any] = {}  # labelled series, looked up once

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count(self, queue: str, task: str, outcome: str, amount: int = 1) -> None:
        self._child(self.jobs, queue, task, outcome).inc(amount)

    def observe_duration(self, queue: str, task: str, seconds: float) -> None:
        self._child(self.duration, queue, task).observe(seconds)

    def observe_latency(self, queue: str, task: str, seconds: float) -> None:
        self._child(self.latency, queue, task).observe(seconds)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
