"""POST /api/v1/jobs answered by EnqueueRoute's shortcut and by FastAPI alone: the same answers, the same rows.

Each request of the matrix goes to the API twice on an empty outbox, once with the shortcut on
and once with it off (every request through FastAPI's parameter solving); statuses, bodies and
the rows written must match, ids and times apart. Plain requests must take the shortcut (its counter moves),
the others must not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from postbox.app.api.enqueue_route import EnqueueRoute, plain_headers
from postbox.settings import Settings
from tests.harness.api import API_KEY, insert_job, make_client

VOLATILE = {"id", "created_at", "available_at", "request_id"}
JSON = {"content-type": "application/json"}

# (name, body bytes, headers, taken by the shortcut)
REQUESTS: list[tuple[str, bytes, list[tuple[str, str]], bool]] = [
    ("plain", b'{"task": "api_sum", "args": {"a": 2, "b": 3}, "priority": 8}', [], True),
    (
        "charset",
        b'{"task": "api_echo", "args": {"text": "x"}}',
        [("content-type", "application/json; charset=utf-8")],
        True,
    ),
    ("idempotency key", b'{"task": "api_echo", "dedup_key": "body"}', [("Idempotency-Key", "hdr-1")], True),
    ("unknown task", b'{"task": "no_such_task"}', [], True),
    ("args the task refuses", b'{"task": "api_sum", "args": {"a": "two"}}', [], True),
    ("right key", b'{"task": "api_echo"}', [("X-API-Key", API_KEY)], True),
    ("wrong key", b'{"task": "api_echo"}', [("X-API-Key", "nope")], False),
    ("missing task", b'{"args": {}}', [], False),
    ("extra field", b'{"task": "api_echo", "colour": "red"}', [], False),
    ("priority out of range", b'{"task": "api_echo", "priority": 10}', [], False),
    ("not an object", b"[1, 2]", [], False),
    ("idempotency key too long", b'{"task": "api_echo"}', [("Idempotency-Key", "k" * 513)], False),
    ("two idempotency keys", b'{"task": "api_echo"}', [("Idempotency-Key", "a"), ("Idempotency-Key", "b")], False),
    ("text body", b'{"task": "api_echo"}', [("content-type", "text/plain")], False),
    ("empty body", b"", [], False),
]


@pytest.fixture(name="shortcut")
def shortcut_fixture() -> Iterator[None]:
    yield
    EnqueueRoute.plain = True


def _answers(client: TestClient, conn: psycopg.Connection[Any], body: bytes, headers: list[tuple[str, str]]) -> Any:
    """The request sent twice (the second a duplicate, when keyed) on an empty outbox: answers and rows."""
    conn.execute("TRUNCATE postbox.outbox")
    conn.commit()
    typed = any(name.lower() == "content-type" for name, _ in headers)
    sent = headers if typed else [("content-type", "application/json"), *headers]
    answers = [_stable(client.post("/api/v1/jobs", content=body, headers=sent)) for _ in range(2)]
    rows = conn.execute(
        "SELECT task, queue, priority, args, dedup_key, state, max_attempts FROM postbox.outbox ORDER BY id"
    ).fetchall()
    conn.commit()
    return [*answers, rows]


def _stable(r: Any) -> tuple[int, Any]:
    body = r.json()
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in VOLATILE}
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("details"), dict):
            error["details"] = {k: v for k, v in error["details"].items() if k not in VOLATILE}
    return r.status_code, body


def test_the_shortcut_answers_as_fastapi_does(
    settings: Settings, conn: psycopg.Connection[Any], shortcut: None
) -> None:
    with make_client(settings, api_key=API_KEY) as client:
        for name, body, headers, taken in REQUESTS:
            EnqueueRoute.plain = True
            before = EnqueueRoute.plain_answers
            fast = _answers(client, conn, body, headers)
            assert EnqueueRoute.plain_answers - before == (2 if taken else 0), name
            EnqueueRoute.plain = False
            slow = _answers(client, conn, body, headers)
            assert EnqueueRoute.plain_answers - before == (2 if taken else 0), name  # off: none through it
            assert fast == slow, name
            assert fast[0][0] in (200, 201, 400, 401, 415, 422), (name, fast)


def test_plain_answers_are_the_same_job_a_get_reads(settings: Settings, shortcut: None) -> None:
    with make_client(settings) as client:
        before = EnqueueRoute.plain_answers
        posted = client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": 1}, "keep_result": True})
        assert EnqueueRoute.plain_answers == before + 1
        assert posted.status_code == 201
        got = client.get(f"/api/v1/jobs/{posted.json()['id']}").json()
    assert {k: v for k, v in posted.json().items() if k != "duplicate"} == got


def test_plain_headers() -> None:
    json = [(b"content-type", b"application/json")]
    assert plain_headers(json) == (None, None)
    assert plain_headers([(b"content-type", b"Application/JSON ; charset=utf-8")]) == (None, None)
    assert plain_headers([*json, (b"x-api-key", b"k"), (b"idempotency-key", b"i")]) == ("k", "i")
    assert plain_headers([*json, (b"idempotency-key", b"i" * 512)]) == (None, "i" * 512)
    assert plain_headers([*json, (b"idempotency-key", b"i" * 513)]) is None
    assert plain_headers([*json, (b"x-api-key", b"a"), (b"x-api-key", b"b")]) is None
    assert plain_headers([(b"content-type", b"text/plain"), *json]) is None  # FastAPI reads the first
    assert plain_headers([(b"content-type", b"application/problem+json")]) is None  # FastAPI's to parse
    assert plain_headers([(b"content-type", b"text/plain")]) is None
    assert plain_headers([]) is None


def test_a_duplicate_with_history_is_written_by_the_model_either_way(
    settings: Settings, conn: psycopg.Connection[Any], shortcut: None
) -> None:
    """The answer orjson does not write (an existing job with history) is the same through both paths."""
    job_id = insert_job(conn, "api_echo", dedup_key="hist", state="retrying", attempts=1)
    conn.execute(
        "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, finished_at, outcome, error_class, error)"
        " VALUES (%s, 1, 'w-1', now(), 'retry', 'ValueError', 'boom')",
        (job_id,),
    )
    conn.commit()
    answers = []
    with make_client(settings) as client:
        for plain in (True, False):
            EnqueueRoute.plain = plain
            r = client.post("/api/v1/jobs", json={"task": "api_echo"}, headers={"Idempotency-Key": "hist"})
            answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1]
    status, body = answers[0]
    assert status == 200 and body["duplicate"] is True and body["id"] == job_id
    assert [(a["attempt"], a["outcome"], a["error_class"]) for a in body["history"]] == [(1, "retry", "ValueError")]
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (1,)
