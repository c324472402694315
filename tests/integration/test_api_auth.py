"""API key: destructive operations need X-API-Key when POSTBOX_API_KEY is set; each success writes one audit row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from postbox.settings import Settings
from tests.harness.api import (  # noqa: F401
    API_KEY,
    audit_rows,
    insert_job,
    job_state,
    keyed_client_fixture,
    make_client,
    make_dead,
)

UNAUTHORIZED = {"error": {"code": "UNAUTHORIZED", "message": "missing or invalid X-API-Key", "details": {}}}


def _cancel(conn: psycopg.Connection[Any]) -> tuple[str, dict[str, Any], str, str]:
    job = insert_job(conn)
    return f"/api/v1/jobs/{job}/cancel", {}, "job.cancel", f"job:{job}"


def _pause(conn: psycopg.Connection[Any]) -> tuple[str, dict[str, Any], str, str]:
    return "/api/v1/queues/apiq/pause", {}, "queue.pause", "queue:apiq"


def _resume(conn: psycopg.Connection[Any]) -> tuple[str, dict[str, Any], str, str]:
    return "/api/v1/queues/apiq/resume", {}, "queue.resume", "queue:apiq"


def _requeue(conn: psycopg.Connection[Any]) -> tuple[str, dict[str, Any], str, str]:
    job = insert_job(conn)
    make_dead(conn, job)
    return f"/api/v1/dlq/{job}/requeue", {}, "dlq.requeue", f"job:{job}"


def _discard(conn: psycopg.Connection[Any]) -> tuple[str, dict[str, Any], str, str]:
    job = insert_job(conn)
    make_dead(conn, job)
    return f"/api/v1/dlq/{job}/discard", {}, "dlq.discard", f"job:{job}"


def _purge(conn: psycopg.Connection[Any]) -> tuple[str, dict[str, Any], str, str]:
    job = insert_job(conn)
    make_dead(conn, job)
    return "/api/v1/dlq/purge", {"queue": "apiq", "confirm": "true"}, "dlq.purge", "queue:apiq"


Setup = Callable[[psycopg.Connection[Any]], tuple[str, dict[str, Any], str, str]]


@pytest.mark.parametrize("setup", [_cancel, _pause, _resume, _requeue, _discard, _purge])
def test_destructive_endpoint_needs_the_key_and_is_audited(
    setup: Setup, keyed_client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    path, params, action, target = setup(conn)
    before = conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'dead'").fetchone()
    conn.commit()
    missing = keyed_client.post(path, params=params)
    assert missing.status_code == 401
    assert missing.json() == UNAUTHORIZED
    wrong = keyed_client.post(path, params=params, headers={"X-API-Key": API_KEY + "x"})
    assert wrong.status_code == 401
    assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'dead'").fetchone() == before
    conn.commit()
    # nothing done; the wrong key is audited as such (not the missing one)
    assert [(r[0], r[1], r[2]) for r in audit_rows(conn)] == [("unauthenticated", "auth.failed", "client:testclient")]

    ok = keyed_client.post(path, params=params, headers={"X-API-Key": API_KEY, "X-Request-ID": "req-42"})
    assert ok.status_code in (200, 202), ok.text
    assert ok.headers["x-request-id"] == "req-42"
    assert audit_rows(conn)[1:] == [("api:key", action, target, "req-42")]
    listed = keyed_client.get("/api/v1/audit", headers={"X-API-Key": API_KEY}).json()
    first = listed["items"][0]
    assert (first["actor"], first["action"], first["target"], first["request_id"]) == (
        "api:key",
        action,
        target,
        "req-42",
    )


def test_reads_and_enqueue_stay_open_with_a_key(keyed_client: TestClient) -> None:
    assert keyed_client.get("/api/v1/jobs").status_code == 200
    assert keyed_client.get("/api/v1/queues").status_code == 200
    assert keyed_client.post("/api/v1/jobs", json={"task": "api_echo"}).status_code == 201


def test_key_for_all_guards_reads_too(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    with make_client(settings, api_key=API_KEY, api_key_for_all=True) as c:
        for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/dlq"), ("GET", "/api/v1/workers")):
            r = c.request(method, path)
            assert r.status_code == 401 and r.json() == UNAUTHORIZED
        assert c.post("/api/v1/jobs", json={"task": "api_echo"}).status_code == 401
        assert c.get("/api/v1/jobs", headers={"X-API-Key": API_KEY}).status_code == 200
        assert c.get("/health").status_code == 200  # probes stay open
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)


def test_in_insecure_mode_without_a_key_destructive_operations_are_open_and_audited_as_anonymous(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    with make_client(settings, api_insecure=True) as c:
        assert c.post("/api/v1/queues/apiq/pause").status_code == 200
    rows = audit_rows(conn)
    assert len(rows) == 1 and rows[0][:3] == ("api:anonymous", "queue.pause", "queue:apiq")
