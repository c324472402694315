"""Failures you can debug: tracebacks logged and kept per attempt, hooks around runs, the run as a span."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace

from postbox import hooks
from postbox.relay import Relay
from postbox.settings import Settings
from tests.harness.api import API_KEY, make_client
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch, finished, running_worker
from tests.integration.test_tracing import spans  # noqa: F401  (the in-memory exporter fixture)


@pytest.fixture
def hook_calls() -> Iterator[list[tuple[Any, ...]]]:
    calls: list[tuple[Any, ...]] = []

    def before(run: hooks.JobRun) -> None:
        calls.append(("before", run.task, run.attempt, run.state))

    async def after(run: hooks.JobRun) -> None:
        assert run.duration is not None and run.duration >= 0
        calls.append(("after", run.task, run.attempt, run.state))

    def failure(run: hooks.JobRun, exc: BaseException) -> None:
        calls.append(("failure", run.task, run.attempt, type(exc).__name__))

    def broken(run: hooks.JobRun) -> None:
        raise RuntimeError("a hook's own bug")

    hooks.before_run(broken)  # first: the others still run, and the job is untouched
    hooks.before_run(before)
    hooks.after_run(after)
    hooks.on_failure(failure)
    yield calls
    hooks.clear()


async def test_failed_attempts_keep_and_log_a_bounded_traceback(
    wsettings: Settings,
    effects: psycopg.AsyncConnection[Any],
    relay: Relay,
    caplog: pytest.LogCaptureFixture,
    settings: Settings,
) -> None:
    job_id = await enqueue(effects, t.w_always_fails)
    with caplog.at_level(logging.WARNING, logger="postbox.job"):
        async with running_worker(wsettings) as worker:
            await finished(worker, 3)
    rows = await fetch(
        effects,
        "SELECT attempt, outcome, error_class, traceback FROM postbox.job_attempts WHERE outbox_id = %s ORDER BY 1",
        (job_id,),
    )
    assert [row[:3] for row in rows] == [
        (1, "retry", "ValueError"),
        (2, "retry", "ValueError"),
        (3, "dead", "ValueError"),
    ]
    for *_, kept in rows:
        assert kept.startswith("Traceback (most recent call last):")
        assert 'tasks/worker.py", line' in kept and "in w_always_fails" in kept
        assert kept.rstrip().endswith("ValueError: boom\nsecond line " + "x" * 1000)
    failed = [r for r in caplog.records if r.getMessage().startswith("run failed")]
    assert len(failed) == 3
    assert "ValueError: boom" in failed[0].getMessage() and "in w_always_fails" in failed[0].getMessage()
    assert failed[0].outbox_id == job_id  # type: ignore[attr-defined]
    # The API's job view shows every attempt's traceback.
    with make_client(settings, api_key=API_KEY) as client:
        job = client.get(f"/api/v1/jobs/{job_id}", headers={"X-API-Key": API_KEY}).json()
    assert [a["traceback"] == r[3] for a, r in zip(job["history"], rows, strict=True)] == [True, True, True]


async def test_a_retry_later_is_a_decision_not_a_traceback(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    job_id = await enqueue(effects, t.w_retry_later, {"seconds": 0.01})
    async with running_worker(wsettings) as worker:
        await finished(worker, 2)
    assert await fetch(
        effects,
        "SELECT attempt, outcome, traceback FROM postbox.job_attempts WHERE outbox_id = %s ORDER BY 1",
        (job_id,),
    ) == [(1, "retry", None), (2, "succeeded", None)]


async def test_hooks_around_every_run(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay, hook_calls: list[tuple[Any, ...]]
) -> None:
    await enqueue(effects, t.w_flaky, {"fail_times": 1})
    async with running_worker(wsettings) as worker:
        await finished(worker, 2)
    assert hook_calls == [
        ("before", "w_flaky", 1, None),
        ("failure", "w_flaky", 1, "RuntimeError"),
        ("after", "w_flaky", 1, "retrying"),
        ("before", "w_flaky", 2, None),
        ("after", "w_flaky", 2, "succeeded"),
    ]
    assert await fetch(effects, "SELECT state, attempts FROM postbox.outbox") == [("succeeded", 2)]


async def test_the_workers_run_is_a_span_linked_to_the_producer(
    wsettings: Settings,
    effects: psycopg.AsyncConnection[Any],
    relay: Relay,
    spans: Any,  # noqa: F811
) -> None:
    with trace.get_tracer("shop").start_as_current_span("POST /signup") as request:
        job_id = await enqueue(effects, t.w_noop)
    async with running_worker(wsettings) as worker:
        await finished(worker, 1)
    [run] = [s for s in spans.get_finished_spans() if s.name == f"process {t.QUEUE}"]
    assert run.attributes["messaging.message.id"] == str(job_id)
    assert run.attributes["postbox.task"] == "w_noop" and run.attributes["postbox.attempt"] == 1
    assert [link.context.trace_id for link in run.links] == [request.get_span_context().trace_id]
