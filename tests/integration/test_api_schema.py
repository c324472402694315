"""Property-based run of the OpenAPI schema (schemathesis): no 5xx, no response that breaks the schema.

Bounded: 25 examples per operation, on the real PostgreSQL and Redis of the fixtures.
Every route of the demo's API is covered: postbox's operations surface and the
Stagedoor example's routes (``create_demo_app``), in insecure mode so that the
destructive operations run. Then every operation gets an oversized body, declared
and chunked: 413 wherever a body is read, never a 5xx.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from postbox.app.api.main import BODY_SLACK
from postbox.settings import Settings
from postbox_examples.stagedoor.cli import create_demo_app

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
STAGEDOOR = {("POST", "/api/v1/events"), ("GET", "/api/v1/events/{event_id}"), ("POST", "/api/v1/orders")}
PATH_VALUES = {"job_id": "1", "queue": "apiq", "worker_id": "worker-1", "event_id": "1"}
LIMIT = 1000  # max_payload_bytes of the fuzzed app: small oversized bodies


@pytest.fixture
def live(settings: Settings) -> Iterator[TestClient]:
    import tests.harness.tasks.api  # noqa: F401  (registers the api_* tasks)

    app = create_demo_app(settings.model_copy(update={"api_insecure": True, "max_payload_bytes": LIMIT}))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _operations(live: TestClient) -> list[tuple[str, str, bool]]:
    """(method, path, has a request body) of every operation in the app's schema."""
    found = []
    for path, item in live.app.openapi()["paths"].items():  # type: ignore[attr-defined]
        for method, operation in item.items():
            found.append((method.upper(), path, "requestBody" in operation))
    return found


def test_no_server_error_and_every_response_matches_the_schema(live: TestClient) -> None:
    schema = schemathesis.openapi.from_dict(live.app.openapi())  # type: ignore[attr-defined]
    failures: list[str] = []
    labels = []
    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)

        @given(case=operation.as_strategy())
        @hsettings(
            max_examples=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
            derandomize=True,
            database=None,
        )
        def run(case: Any) -> None:
            kwargs = case.as_transport_kwargs(base_url="http://testserver")
            # The case's cookies (the dashboard's session and CSRF parameters) go on the client, for
            # this request only: per-request cookies are deprecated by Starlette's test client.
            live.cookies.clear()
            live.cookies.update(kwargs.pop("cookies", None) or {})
            response = live.request(**kwargs)
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    operations = _operations(live)
    assert len(labels) == len(operations), labels
    assert STAGEDOOR <= {(method, path) for method, path, _ in operations}
    assert failures == []


class _PathValues(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "1"  # a parameter of a route added later: any valid-looking value


def _oversized(size: int) -> Iterator[bytes]:
    yield b'{"x": "'
    for _ in range(size // 8192 + 1):
        yield b"x" * 8192
    yield b'"}'


def test_every_operation_refuses_an_oversized_body_declared_or_chunked(live: TestClient) -> None:
    limit = LIMIT + BODY_SLACK
    seen = []
    for method, template, has_body in _operations(live):
        path = template.format_map(_PathValues(PATH_VALUES))
        headers = {"Content-Type": "application/json"}
        declared = live.request(method, path, content=b" " * (limit + 1), headers=headers)
        assert declared.status_code == 413, (method, path, declared.status_code)
        assert declared.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
        chunked = live.request(method, path, content=_oversized(2 * limit), headers=headers)
        assert chunked.status_code < 500, (method, path, chunked.status_code, chunked.text[:200])
        if has_body:
            assert chunked.status_code == 413, (method, path, chunked.status_code)
        seen.append((method, template))
    assert STAGEDOOR <= set(seen)
