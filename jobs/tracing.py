"""OpenTelemetry, when it is installed (``pip install postbox[otel]``); nothing at all when it is not.

- At enqueue, the producer's current trace context (W3C ``traceparent`` and
  ``tracestate``) goes into the job's headers, unless the caller set them.
- The relay's publish of a batch and the worker's run of a job are spans
  (``postbox publish`` / ``postbox process``) linked to the producer's context
  from the headers, with the standard messaging attributes: the system, the
  queue as the destination, the job id as the message id, the operation; plus
  the task and the attempt.

Whether OpenTelemetry is importable is looked up once; without it every
function here returns at once. With the API but no tracer provider set,
neither the worker nor the relay makes spans (:func:`recording`): a
non-recording span per batch cost the relay about 13 µs in a hot loop, and
several times that at low rates, on the path from a commit to the XADD.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

SYSTEM = "postbox"
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_LINKS = 128  # per publish span: a batch of thousands links its first jobs only


@cache
def available() -> bool:
    return importlib.util.find_spec("opentelemetry") is not None


def recording() -> bool:
    """Whether a span made now could be recorded: OpenTelemetry installed and a tracer provider set.

    Without a provider (the API's default proxy, or the no-op one) a span is the
    invalid span whatever its parent: the worker skips making one per job.
    Looked up each time, as a provider may be set after the worker started.
    """
    if not available():
        return False
    from opentelemetry import trace

    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


class RecordingCheck:
    """:func:`recording`, asked again only after ``every`` seconds: what a hot loop calls instead.

    Each lookup reads the environment (OpenTelemetry's provider setting): about
    2 % of the worker's CPU per job when it was asked for every run, and one
    lookup per batch on the relay's path from a notification to its XADD. A
    provider set later is seen within ``every`` seconds.
    """

    def __init__(self, every: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._monotonic = monotonic
        self._answer = False
        self._asked_at = -float("inf")

    def __call__(self) -> bool:
        now = self._monotonic()
        if now - self._asked_at >= self._every:
            self._answer, self._asked_at = recording(), now
        return self._answer


def with_trace_context(headers: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``headers`` plus the current trace context, if there is one and the caller did not set it."""
    if not available():
        return headers
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    if headers is not None and any(key in headers for key in TRACE_HEADERS):
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return headers
    return {**(headers or {}), **{k: v for k, v in carrier.items() if k in TRACE_HEADERS}}


def _link(headers: Mapping[str, Any] | str | None) -> Any:
    from opentelemetry import propagate, trace

    if not headers or "traceparent" not in headers:
        return None
    if isinstance(headers, str):  # the JSON text a relay row carries
        import orjson

        headers = orjson.loads(headers)
        if not isinstance(headers, dict):
            return None
    context = trace.get_current_span(propagate.extract({k: str(headers[k]) for k in TRACE_HEADERS if k in headers}))
    span_context = context.get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None


@contextmanager
def process_span(
    job_id: int, task: str, queue: str, attempt: int, headers: Mapping[str, Any] | str | None
) -> Iterator[Any]:
    """The worker's run of one job, linked to the producer's trace."""
    if not recording():
        yield None
        return
    from opentelemetry import trace

    link = _link(headers)
    tracer = trace.get_tracer("postbox.worker")
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": str(job_id),
        "postbox.task": task,
        "postbox.attempt": attempt,
    }
    with tracer.start_as_current_span(
        f"process {queue}", kind=trace.SpanKind.CONSUMER, attributes=attributes, links=[link] if link else None
    ) as span:
        yield span


@contextmanager
def publish_span(rows: Sequence[Sequence[Any]], *, recorded: bool | None = None) -> Iterator[Any]:
    """The relay's publish of one batch, linked to its producers' traces.

    ``rows`` as the relay selects them: (id, queue, task, args, headers text, ...).
    ``recorded``: what :func:`recording` answers, when the caller knows (None: asked here).
    """
    if not rows or not (recording() if recorded is None else recorded):
        yield None
        return
    from opentelemetry import trace

    links = [link for link in (_link(row[4]) for row in rows[:MAX_LINKS]) if link is not None]
    queues = sorted({row[1] for row in rows})
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "publish",
        "messaging.operation.name": "publish",
        "messaging.batch.message_count": len(rows),
    }
    if len(queues) == 1:
        attributes["messaging.destination.name"] = queues[0]
    if len(rows) == 1:
        attributes["messaging.message.id"] = str(rows[0][0])
    tracer = trace.get_tracer("postbox.relay")
    name = f"publish {queues[0]}" if len(queues) == 1 else "publish"
    with tracer.start_as_current_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes, links=links) as span:
        yield span
