"""OpenTelemetry: the producer's trace context travels in the job's headers; publish and run are linked spans.

With the SDK's in-memory exporter, in-process components on real PostgreSQL and Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from postbox import enqueue, tracing
from postbox.relay.publisher import Publisher
from tests.harness.tasks import core as tasks_core

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process (OpenTelemetry allows no second time)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def test_no_span_no_headers(conn: psycopg.Connection[Any], spans: InMemorySpanExporter) -> None:
    with conn.transaction():
        enqueue(conn, tasks_core.noop)
    assert conn.execute("SELECT headers FROM postbox.outbox").fetchall() == [({},)]


async def test_trace_context_from_producer_to_publish(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], redis: Any, settings: Any, spans: Any
) -> None:
    tracer = trace.get_tracer("shop")
    with tracer.start_as_current_span("POST /orders") as request, conn.transaction():
        enqueue(conn, tasks_core.send_welcome, {"user_id": 1})
        enqueue(conn, tasks_core.noop, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    trace_id = f"{request.get_span_context().trace_id:032x}"
    span_id = f"{request.get_span_context().span_id:016x}"
    [(mine,), (theirs,)] = conn.execute("SELECT headers FROM postbox.outbox ORDER BY id").fetchall()
    assert mine["traceparent"].startswith(f"00-{trace_id}-{span_id}-")
    assert theirs["traceparent"].startswith("00-" + "1" * 32)  # the caller's own header wins

    await aconn.set_autocommit(True)
    result = await Publisher(redis, settings.redis_prefix).publish_batch(aconn)
    assert len(result.published) == 2
    [publish] = [s for s in spans.get_finished_spans() if s.name.startswith("publish")]
    assert publish.kind == trace.SpanKind.PRODUCER
    assert publish.attributes["messaging.system"] == "postbox"
    assert publish.attributes["messaging.operation.type"] == "publish"
    assert publish.attributes["messaging.batch.message_count"] == 2
    linked = sorted(f"{link.context.trace_id:032x}" for link in publish.links)
    assert linked == sorted([trace_id, "1" * 32])


def test_process_span_links_to_the_producer(spans: InMemorySpanExporter) -> None:
    headers = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    with tracing.process_span(7, "send_welcome", "mail", 2, headers):
        pass
    [span] = spans.get_finished_spans()
    assert (span.name, span.kind) == ("process mail", trace.SpanKind.CONSUMER)
    assert dict(span.attributes or {}) == {
        "messaging.system": "postbox",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": "7",
        "postbox.task": "send_welcome",
        "postbox.attempt": 2,
    }
    assert [f"{link.context.trace_id:032x}" for link in span.links] == ["a" * 32]
