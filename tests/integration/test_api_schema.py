"""Property-based run of the OpenAPI schema (schemathesis): no 5xx, no response that breaks the schema.

Bounded: 25 examples per operation, on the real PostgreSQL and Redis of the fixtures.
Only the operations surface is covered here (the Stagedoor routes have their own tests).
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

from postbox.settings import Settings
from tests.integration.api_support import make_client

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
OWN_PATHS = r"^/(api/v1/(jobs|queues|workers|dlq|audit)|health|ready|metrics)"


@pytest.fixture
def live(settings: Settings) -> Iterator[TestClient]:
    with make_client(settings) as c:
        yield c


def test_no_server_error_and_every_response_matches_the_schema(live: TestClient) -> None:
    schema = schemathesis.openapi.from_dict(live.app.openapi()).include(path_regex=OWN_PATHS)  # type: ignore[attr-defined]
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
            response = live.request(**kwargs)
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    assert len(labels) == 20, labels
    assert failures == []
