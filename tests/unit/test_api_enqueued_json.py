"""The enqueue answer written by orjson is the bytes FastAPI's response model would write."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import TypeAdapter

from postbox.app.api.routes_jobs import enqueued_json
from postbox.app.api.schemas import EnqueuedJob
from postbox.app.services.jobs import Attempt, Job
from postbox.app.services.results import as_dict

MODEL = TypeAdapter(EnqueuedJob)


def _job(**changes: Any) -> Job:
    base: dict[str, Any] = {
        "id": 42,
        "task": "send_email",
        "queue": "mail",
        "priority": 5,
        "state": "pending",
        "attempts": 0,
        "max_attempts": 5,
        "created_at": datetime(2026, 12, 2, 9, 1, 2, 123456, tzinfo=UTC),
        "available_at": datetime(2026, 12, 2, 9, 1, 32, tzinfo=UTC),
        "published_at": None,
        "started_at": None,
        "finished_at": None,
        "expires_at": None,
        "cancel_requested_at": None,
        "discarded_at": None,
        "dedup_key": None,
        "worker_id": None,
        "last_error_class": None,
        "last_error": None,
        "args": {"to": "a@example.org", "n": 1, "ratio": 0.1, "big": 10**16, "nested": [1, {"é": "\u2028"}]},
        "keep_result": False,
        "result": None,
        "history": [],
        "progress": None,
    }
    return Job(**{**base, **changes})


def _as_the_model_writes(job: Job, duplicate: bool) -> bytes:
    """What the route wrote before: the dict validated by the response model, then dumped by it."""
    return MODEL.dump_json(MODEL.validate_python({**as_dict(job), "duplicate": duplicate}))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"dedup_key": "order-7", "expires_at": datetime(2026, 12, 3, tzinfo=UTC), "keep_result": True},
        {"created_at": datetime(2026, 12, 2, 10, 0, tzinfo=ZoneInfo("Europe/Berlin"))},
        {"available_at": datetime(2026, 12, 2, 10, 0, 0, 5, tzinfo=timezone(timedelta(hours=5, minutes=30)))},
        {"args": {}},
        {"state": "waiting", "priority": 9, "queue": "q-1"},
    ],
)
@pytest.mark.parametrize("duplicate", [False, True])
def test_same_bytes_as_the_response_model(changes: dict[str, Any], duplicate: bool) -> None:
    job = _job(**changes)
    assert enqueued_json(job, duplicate) == _as_the_model_writes(job, duplicate)


def test_every_field_of_the_model_is_written_in_its_order() -> None:
    written = enqueued_json(_job(), False)
    assert written is not None
    assert list(TypeAdapter(dict[str, Any]).validate_json(written)) == list(EnqueuedJob.model_fields)


def test_left_to_the_model_what_orjson_would_write_differently() -> None:
    attempt = Attempt(
        attempt=1,
        life=1,
        worker_id="worker-1",
        started_at=datetime(2026, 12, 2, tzinfo=UTC),
        finished_at=None,
        outcome=None,
        error_class=None,
        error=None,
        traceback=None,
    )
    progress = {"done": 5, "total": None, "note": None, "attempt": 1, "at": datetime(2026, 12, 2, tzinfo=UTC)}
    assert enqueued_json(_job(history=[attempt]), True) is None
    assert enqueued_json(_job(progress=progress), True) is None  # the model writes done=5 as 5.0
    assert enqueued_json(_job(args={"n": 2**70}), False) is None  # wider than orjson's integers


def test_the_job_dataclass_has_every_field_the_answer_takes_from_it() -> None:
    names = {field.name for field in dataclasses.fields(Job)}
    assert set(EnqueuedJob.model_fields) - names == {"redacted", "duplicate"}
