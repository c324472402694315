"""ApiMetrics.served and count_enqueued: the per-request series, children kept between calls."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from postbox.app.api.metrics import ApiMetrics


def _samples(metrics: ApiMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_every_request_is_counted_and_timed_under_its_own_labels() -> None:
    metrics = ApiMetrics()
    for _ in range(3):
        metrics.served("POST", "/api/v1/jobs", 201, 0.002)
    metrics.served("POST", "/api/v1/jobs", 422, 0.5)
    metrics.served("GET", "/health", 200, 0.001)
    got = _samples(metrics)
    route = ("route", "/api/v1/jobs")
    assert got[("postbox_api_requests_total", (("method", "POST"), route, ("status", "201")))] == 3
    assert got[("postbox_api_requests_total", (("method", "POST"), route, ("status", "422")))] == 1
    assert got[("postbox_api_requests_total", (("method", "GET"), ("route", "/health"), ("status", "200")))] == 1
    assert got[("postbox_api_request_duration_seconds_count", (("method", "POST"), route))] == 4
    assert got[("postbox_api_request_duration_seconds_sum", (("method", "POST"), route))] == pytest.approx(0.506)


def test_enqueues_are_counted_by_queue_and_outcome() -> None:
    metrics = ApiMetrics()
    for outcome in ("created", "created", "duplicate", "queue_full"):
        metrics.count_enqueued("mail", outcome)
    metrics.count_enqueued("sms", "created")
    got = _samples(metrics)
    assert got[("postbox_api_enqueued_total", (("outcome", "created"), ("queue", "mail")))] == 2
    assert got[("postbox_api_enqueued_total", (("outcome", "duplicate"), ("queue", "mail")))] == 1
    assert got[("postbox_api_enqueued_total", (("outcome", "queue_full"), ("queue", "mail")))] == 1
    assert got[("postbox_api_enqueued_total", (("outcome", "created"), ("queue", "sms")))] == 1
