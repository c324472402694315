"""Prometheus metrics of one relay process (served on ``relay_metrics_port``; 0 = off).

Each :class:`RelayMetrics` has its own registry, so several relays can live in
one test process. Labels are bounded: none here carry ids or payloads.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

BATCH_BUCKETS = (1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 50_000)


class RelayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.backlog = Gauge(
            "postbox_relay_backlog", "Outbox rows that are due and not yet published.", registry=self.registry
        )
        self.oldest_age = Gauge(
            "postbox_relay_oldest_unpublished_age_seconds",
            "Seconds since the oldest due, unpublished row became due.",
            registry=self.registry,
        )
        self.published = Counter("postbox_relay_published", "Rows published to Redis streams.", registry=self.registry)
        self.batch_size = Histogram(
            "postbox_relay_batch_size", "Rows per publish batch.", buckets=BATCH_BUCKETS, registry=self.registry
        )
        self.republished = Counter(
            "postbox_relay_republished",
            "Rows published again because Redis lost them (data loss or a missing entry).",
            registry=self.registry,
        )
        self.fair_in_flight = Gauge(
            "postbox_relay_fair_in_flight",
            "Jobs of a fair queue published and unfinished, as of the relay's last fill of its window.",
            ["queue"],
            registry=self.registry,
        )
        self.workflow_jobs = Counter(
            "postbox_relay_workflow_jobs",
            "Jobs of workflows that left 'waiting' as the relay was told (type: released, or cancelled by policy).",
            ["type"],
            registry=self.registry,
        )
        self.workflows_ended = Counter(
            "postbox_relay_workflows_ended",
            "Workflows whose jobs have all ended, marked and announced by the relay, by final status.",
            ["status"],
            registry=self.registry,
        )
        self.is_leader = Gauge("postbox_relay_is_leader", "1 while this relay leads, else 0.", registry=self.registry)
        self._server: Any = None

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``port`` (a daemon thread)."""
        result = start_http_server(port, addr=addr, registry=self.registry)
        self._server = result[0] if isinstance(result, tuple) else None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
