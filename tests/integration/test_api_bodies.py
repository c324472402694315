"""Request bodies on every route: a streamed size limit, malformed JSON as a 4xx, every response counted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from postbox.app.api.main import BODY_SLACK, create_app
from postbox.registry import default_registry
from postbox.settings import Settings
from postbox_examples.stagedoor.cli import create_demo_app
from tests.harness.api import client_fixture  # noqa: F401

LIMIT = 1000  # max_payload_bytes of these tests
BODY_LIMIT = LIMIT + BODY_SLACK
DEEP = b'{"a": ' * 5000 + b"1" + b"}" * 5000
SURROGATE = b'"\\ud800"'


@pytest.fixture
def demo(settings: Settings) -> Iterator[TestClient]:
    """The demo's API (postbox's routes and Stagedoor's), with a small payload limit."""
    with TestClient(
        create_demo_app(settings.model_copy(update={"max_payload_bytes": LIMIT})), raise_server_exceptions=False
    ) as c:
        yield c


def _chunks(total: int, size: int = 16_384) -> Iterator[bytes]:
    """A body sent chunked (no Content-Length): a JSON string of ``total`` bytes."""
    yield b'{"task": "api_echo", "args": {"text": "'
    sent = 0
    while sent < total:
        yield b"x" * size
        sent += size
    yield b'"}}'


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/events", "/api/v1/orders", "/api/v1/queues/q/pause"])
def test_a_declared_length_over_the_limit_is_refused_on_every_route(demo: TestClient, path: str) -> None:
    r = demo.post(path, content=b"{" + b" " * BODY_LIMIT + b"}", headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert r.json()["error"]["details"] == {"limit": BODY_LIMIT}


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/events", "/api/v1/orders"])
def test_a_chunked_body_over_the_limit_is_refused(demo: TestClient, path: str) -> None:
    r = demo.post(path, content=_chunks(4 * BODY_LIMIT), headers={"Content-Type": "application/json"})
    assert r.request.headers.get("content-length") is None
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"


def test_a_chunked_body_under_the_limit_is_served(demo: TestClient) -> None:
    r = demo.post("/api/v1/jobs", content=_chunks(500, size=100), headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text


BAD_VALUES = {
    "lone surrogate": SURROGATE,
    "deep nesting": DEEP,
    "NaN": b"NaN",
    "Infinity": b"1e400",
}
TEMPLATES = {  # each bad value where the route would otherwise accept it
    "/api/v1/jobs": b'{"task": "api_echo", "args": {"text": VALUE}}',
    "/api/v1/events": b'{"name": VALUE, "capacity": 10}',
    "/api/v1/orders": b'{"event_id": 1, "seats": 1, "email": VALUE}',
}


@pytest.mark.parametrize("name", [*sorted(BAD_VALUES), "bad json"])
@pytest.mark.parametrize("path", sorted(TEMPLATES))
def test_malformed_json_is_a_4xx_json_error(demo: TestClient, path: str, name: str) -> None:
    body = TEMPLATES[path].replace(b"VALUE", BAD_VALUES[name]) if name != "bad json" else b'{"name": '
    r = demo.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, (name, r.status_code, r.text)
    assert set(r.json()["error"]) == {"code", "message", "details"}


def _count(client: TestClient, route: str, status: int) -> float:
    text = client.get("/metrics").text
    line = f'postbox_api_requests_total{{method="POST",route="{route}",status="{status}"}} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_every_response_is_counted_500s_and_413s_too(settings: Settings) -> None:
    boom = APIRouter()

    @boom.post("/boom")
    async def explode() -> None:
        raise RuntimeError("a bug")

    app: FastAPI = create_app(
        settings.model_copy(update={"max_payload_bytes": LIMIT}), registry=default_registry, routers=[boom]
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/api/v1/boom")
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "INTERNAL_ERROR"
        assert c.post("/api/v1/jobs", content=b" " * (BODY_LIMIT + 1)).status_code == 413
        assert _count(c, "/api/v1/boom", 500) == 1.0
        assert _count(c, "unmatched", 413) == 1.0


def test_a_route_that_parses_with_python_json_is_guarded_too(settings: Settings) -> None:
    """An application's plain router (no StrictJsonRoute): the app-wide JSON guard refuses the body first."""
    plain = APIRouter()

    @plain.post("/notes")
    async def note(body: dict[str, Any]) -> dict[str, int]:
        return {"keys": len(body)}

    app = create_app(settings, registry=default_registry, routers=[plain])
    with TestClient(app, raise_server_exceptions=False) as c:
        for name, value in BAD_VALUES.items():
            r = c.post("/api/v1/notes", content=b'{"v": ' + value + b"}", headers={"Content-Type": "application/json"})
            assert r.status_code == 422, (name, r.status_code, r.text)
            assert r.json()["error"]["details"]["field"] == "body"
        untyped = c.post("/api/v1/notes", content=b'{"v": NaN}')  # no Content-Type: FastAPI would parse it
        assert untyped.status_code == 422
        ok = c.post("/api/v1/notes", json={"a": 1, "b": [1, 2]})
        assert (ok.status_code, ok.json()) == (200, {"keys": 2})
