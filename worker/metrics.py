"""Prometheus metrics of one worker process. Labels: queue, task, outcome only.

Each :class:`Worker` gets its own registry (several workers may share a test
process); the CLI serves it on ``worker_metrics_port``.
"""

from __future__ import annotations

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

    def count(self, queue: str, task: str, outcome: str, amount: int = 1) -> None:
        self.jobs.labels(queue, task, outcome).inc(amount)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
