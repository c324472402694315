"""Inputs the API schema fuzz (tests/integration/test_api_schema.py) and the input audit found answered
with a 500 or with the wrong route; each answered now as the API's typed JSON error, or served."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
from starlette.types import Message, Receive, Scope, Send

from postbox.app.api.body_guard import BodyGuard
from postbox.settings import Settings
from tests.harness.api import make_client


def test_a_content_length_of_5000_digits_is_413_not_a_500(settings: Settings) -> None:
    # int() refuses strings past 4,300 digits: the body guard raised ValueError (500).
    with make_client(settings, api_insecure=True) as client:
        response = client.post(
            "/api/v1/jobs",
            content=b"{}",
            headers={"Content-Type": "application/json", "Content-Length": "9" * 5000},
        )
    assert response.status_code == 413, response.text[:200]
    error = response.json()["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE" and "5000-digit" in error["message"]


async def test_a_non_ascii_digit_content_length_is_400_not_a_500() -> None:
    # The header byte 0xB2 reaches the app as "\u00b2" (latin-1), which str.isdigit() accepts and
    # int() refuses: a ValueError (500). HTTP clients re-encode such a header, so the raw ASGI call.
    reached: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope)

    for raw in (b"\xb2", b"\xb9\xb3", b"\xbd"):
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: Message, sent: list[Message] = sent) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/api/v1/jobs", "headers": [(b"content-length", raw)]}
        await BodyGuard(app, limit=1000, timeout=5)(scope, receive, send)
        assert sent[0]["status"] == 400, raw
        assert orjson.loads(sent[1]["body"])["error"] == {
            "code": "BAD_REQUEST",
            "message": "invalid Content-Length",
            "details": {},
        }
    assert reached == []


def test_a_task_name_with_a_line_break_has_its_limits_over_rest(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    # Starlette's {name:path} does not match a newline: PUT /api/v1/limits/task/a%0Ab was a 404 "no route".
    path = "/api/v1/limits/task/line%0Abreak"
    with make_client(settings, api_insecure=True) as client:
        put = client.put(path, json={"concurrency": 2})
        assert put.status_code == 200, put.text[:200]
        assert (put.json()["name"], put.json()["override"]) == ("line\nbreak", {"concurrency": 2})
        got = client.get(path)
        assert (got.status_code, got.json()["effective"]["concurrency"]) == (200, 2)
        cleared = client.delete(path)
        assert (cleared.status_code, cleared.json()["override"]) == (200, None)
    rows = conn.execute("SELECT name FROM postbox.limits WHERE scope = 'task'").fetchall()
    assert rows == [("line\nbreak",)]
