"""The relay's publish span exists only where a tracer provider records it (a fresh process: the provider is global)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

SCRIPT = textwrap.dedent(
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from postbox import tracing

    rows = [(1, "default", "noop", "{}", "{}", 5, 0, 0)]
    with tracing.publish_span(rows) as span:
        print("without a provider:", span)
    trace.set_tracer_provider(TracerProvider())
    with tracing.publish_span(rows) as span:
        print("with one:", span is not None and span.is_recording())
    with tracing.publish_span([]) as span:
        print("no rows:", span)
    """
)


def test_publish_spans_only_where_a_provider_records_them() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["without a provider: None", "with one: True", "no rows: None"]
