"""Prometheus metrics of the API process: request counters and queue gauges.

Queue gauges are computed at scrape time from PostgreSQL and Redis (the same
numbers as ``GET /api/v1/queues``); so are the flow-control gauges (those of
``GET /api/v1/limits``). Labels are bounded: queue, kind, method, route
template, status, worker status, a limit's scope and name (a queue or a
registered task) — never ids, payloads or error text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

COUNT_KINDS = ("backlog", "scheduled", "queued", "in_flight", "retrying", "dead", "discarded")


class QueueCollector(Collector):
    """Yields the gauges of the latest snapshot (set just before each scrape)."""

    def __init__(self) -> None:
        self.queues: Sequence[dict[str, Any]] = ()
        self.workers: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "postbox_queue_jobs", "Jobs of a queue by kind (exact, PostgreSQL).", labels=["queue", "kind"]
        )
        paused = GaugeMetricFamily("postbox_queue_paused", "1 when the queue is paused.", labels=["queue"])
        oldest = GaugeMetricFamily(
            "postbox_queue_oldest_waiting_seconds", "Age of the oldest due, unstarted job.", labels=["queue"]
        )
        entries = GaugeMetricFamily(
            "postbox_queue_stream_entries", "Entries in the queue's Redis streams (approximate).", labels=["queue"]
        )
        pending = GaugeMetricFamily(
            "postbox_queue_stream_pending", "Delivered, unacknowledged stream entries (approximate).", labels=["queue"]
        )
        for q in self.queues:
            name = q["queue"]
            for kind in COUNT_KINDS:
                jobs.add_metric([name, kind], float(q[kind]))
            paused.add_metric([name], 1.0 if q["paused"] else 0.0)
            oldest.add_metric([name], float(q["oldest_waiting_seconds"] or 0.0))
            if q["in_streams"] is not None:
                entries.add_metric([name], float(q["in_streams"]))
            if q["stream_pending"] is not None:
                pending.add_metric([name], float(q["stream_pending"]))
        workers = GaugeMetricFamily("postbox_workers", "Registered workers by status.", labels=["status"])
        for status in ("live", "stale", "stopped"):
            workers.add_metric([status], float(self.workers.get(status, 0)))
        yield from (jobs, paused, oldest, entries, pending, workers)


class LimitCollector(Collector):
    """Flow-control gauges per queue and task with a limit row (set just before each scrape).

    ``limits`` is ``postbox.app.services.limits.gauges()``: (scope, name, values). A limit not in
    force (no concurrency, no rate) has no sample in that gauge.
    """

    def __init__(self) -> None:
        self.limits: Sequence[tuple[str, str, dict[str, float]]] = ()

    def collect(self) -> Iterator[Metric]:
        labels = ["scope", "name"]
        families = {
            "concurrency": GaugeMetricFamily(
                "postbox_limit_concurrency", "Concurrency limit in force (declared or overridden).", labels=labels
            ),
            "rate_per_second": GaugeMetricFamily(
                "postbox_limit_rate_per_second", "Rate limit in force, in starts per second.", labels=labels
            ),
            "in_use": GaugeMetricFamily(
                "postbox_limit_slots_in_use",
                "Concurrency slots in use (jobs running under a live lease; partitions summed).",
                labels=labels,
            ),
            "held": GaugeMetricFamily(
                "postbox_limit_held_jobs",
                "Jobs of the queue or task held back by a limit (waiting for a slot or a rate reservation).",
                labels=labels,
            ),
        }
        for scope, name, values in self.limits:
            for key, family in families.items():
                if key in values:
                    family.add_metric([scope, name], values[key])
        yield from families.values()


class WorkflowCollector(Collector):
    """Workflow gauges (set just before each scrape): workflows with a job not ended, waiting jobs by queue."""

    def __init__(self) -> None:
        self.active: int | None = None
        self.waiting: Sequence[tuple[str, int]] = ()

    def collect(self) -> Iterator[Metric]:
        if self.active is None:
            return
        active = GaugeMetricFamily("postbox_workflows_active", "Workflows with a job that has not ended.")
        active.add_metric([], float(self.active))
        waiting = GaugeMetricFamily(
            "postbox_queue_waiting_jobs", "Jobs of workflows waiting for their upstream jobs.", labels=["queue"]
        )
        for queue, count in self.waiting:
            waiting.add_metric([queue], float(count))
        yield from (active, waiting)


class ApiMetrics:
    """One registry per app (so several apps in one process do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "postbox_api_requests",
            "HTTP requests served.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "postbox_api_request_duration_seconds",
            "HTTP request duration.",
            ["method", "route"],
            registry=self.registry,
        )
        self.enqueued = Counter(
            "postbox_api_enqueued", "Jobs enqueued through the API.", ["queue", "outcome"], registry=self.registry
        )
        # labels() validates and looks up its child under a lock (about 4 µs a call); the
        # children of the per-request series are kept here, one per label set, as the
        # metrics keep them anyway.
        self._served: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._enqueued: dict[tuple[str, str], Any] = {}
        self.auth_failures = Counter(
            "postbox_api_auth_failures",
            "Refused authentications: reason missing (no key sent where one is needed), invalid (a wrong "
            "key), no_key_configured (a destructive call while POSTBOX_API_KEY is unset).",
            ["reason"],
            registry=self.registry,
        )
        for reason in ("missing", "invalid", "no_key_configured"):
            self.auth_failures.labels(reason)
        self.auth_throttled = Counter(
            "postbox_api_auth_throttled",
            "Attempts with a key refused (429) because their client sent too many wrong keys, by surface: "
            "api (X-API-Key), login (the dashboard), websocket (/ws/events).",
            ["surface"],
            registry=self.registry,
        )
        for surface in ("api", "login", "websocket"):
            self.auth_throttled.labels(surface)
        self.queues = QueueCollector()
        self.registry.register(self.queues)
        self.limits = LimitCollector()
        self.registry.register(self.limits)
        self.workflows = WorkflowCollector()
        self.registry.register(self.workflows)

    def served(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request answered: counted by method, route and status, timed by method and route."""
        children = self._served.get((method, route, status))
        if children is None:
            children = (self.requests.labels(method, route, str(status)), self.duration.labels(method, route))
            self._served[(method, route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def count_enqueued(self, queue: str, outcome: str) -> None:
        """One enqueue through the API: created, duplicate or queue_full."""
        child = self._enqueued.get((queue, outcome))
        if child is None:
            child = self._enqueued[(queue, outcome)] = self.enqueued.labels(queue, outcome)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
