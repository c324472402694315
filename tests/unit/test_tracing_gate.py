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


CHECK_SCRIPT = textwrap.dedent(
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from postbox import tracing

    now = [100.0]
    check = tracing.RecordingCheck(every=1.0, monotonic=lambda: now[0])
    print("no provider:", check())
    trace.set_tracer_provider(TracerProvider())
    now[0] = 100.9
    print("set, 0.9 s later:", check())
    now[0] = 101.0
    print("1 s after the last look:", check())
    """
)


def test_the_recording_check_sees_a_provider_set_later_within_its_interval() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK_SCRIPT], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "no provider: False",
        "set, 0.9 s later: False",
        "1 s after the last look: True",
    ]
