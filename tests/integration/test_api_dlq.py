"""REST dead letters: list, show, requeue, discard, purge (outcomes simulated in SQL here;
the end-to-end flow with the real relay and worker is in test_api_dlq_flow.py)."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi.testclient import TestClient

from tests.harness.api import audit_rows, client_fixture, insert_job, job_state, make_dead  # noqa: F401


def test_list_show_and_filters(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    a = insert_job(conn)
    make_dead(conn, a, attempts=2, error="first")
    b = insert_job(conn, task="api_sum", queue="other")
    make_dead(conn, b, attempts=1, error="second")
    insert_job(conn, state="succeeded")
    listed = client.get("/api/v1/dlq").json()
    assert [j["id"] for j in listed["items"]] == [b, a]
    assert listed["next_cursor"] is None
    assert [j["id"] for j in client.get("/api/v1/dlq", params={"queue": "apiq"}).json()["items"]] == [a]
    assert [j["id"] for j in client.get("/api/v1/dlq", params={"task": "api_sum"}).json()["items"]] == [b]
    page = client.get("/api/v1/dlq", params={"limit": 1}).json()
    assert [j["id"] for j in page["items"]] == [b]
    rest = client.get("/api/v1/dlq", params={"limit": 1, "cursor": page["next_cursor"]}).json()
    assert [j["id"] for j in rest["items"]] == [a] and rest["next_cursor"] is None

    shown = client.get(f"/api/v1/dlq/{a}")
    assert shown.status_code == 200
    body = shown.json()
    assert (body["state"], body["last_error_class"], body["last_error"], body["discarded"]) == (
        "dead",
        "PermanentError",
        "first",
        False,
    )
    assert [(h["attempt"], h["outcome"]) for h in body["history"]] == [(1, "retry"), (2, "dead")]


def test_show_errors(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    alive = insert_job(conn)
    r = client.get(f"/api/v1/dlq/{alive}")
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "code": "NOT_FOUND",
            "message": f"job {alive} is not a dead letter (state pending)",
            "details": {"id": alive, "state": "pending"},
        }
    }
    assert client.get("/api/v1/dlq/99999").status_code == 404


def test_requeue_resets_attempts_and_keeps_history(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    job = insert_job(conn)
    make_dead(conn, job, attempts=2)
    r = client.post(f"/api/v1/dlq/{job}/requeue")
    assert r.status_code == 200
    assert r.json() == {
        "id": job, "queue": "apiq", "task": "api_echo", "state": "pending", "attempts": 0, "resumed": []
    }  # fmt: skip
    row = conn.execute(
        "SELECT state, attempts, published_at, finished_at, claimed_by FROM postbox.outbox WHERE id = %s", (job,)
    ).fetchone()
    assert row == ("pending", 0, None, None, None)
    conn.commit()
    # a second life dies again: both lives stay in the history, in order
    make_dead(conn, job, attempts=1, error="again")
    history = client.get(f"/api/v1/jobs/{job}").json()["history"]
    assert [(h["life"], h["attempt"], h["outcome"]) for h in history] == [
        (1, 1, "retry"),
        (1, 2, "dead"),
        (2, 1, "dead"),
    ]
    assert client.post(f"/api/v1/dlq/{job}/requeue").status_code == 200
    make_dead(conn, job, attempts=1)
    history = client.get(f"/api/v1/jobs/{job}").json()["history"]
    assert [(h["life"], h["attempt"]) for h in history] == [(1, 1), (1, 2), (2, 1), (3, 1)]


def test_requeue_and_discard_errors(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    alive = insert_job(conn)
    r = client.post(f"/api/v1/dlq/{alive}/requeue")
    assert r.status_code == 409
    assert r.json() == {
        "error": {
            "code": "CONFLICT",
            "message": f"job {alive} is not a dead letter (state pending)",
            "details": {"id": alive, "state": "pending"},
        }
    }
    assert client.post(f"/api/v1/dlq/{alive}/discard").status_code == 409
    assert client.post("/api/v1/dlq/88888/requeue").status_code == 404
    assert client.post("/api/v1/dlq/88888/discard").status_code == 404
    assert job_state(conn, alive) == "pending"
    assert audit_rows(conn) == []


def test_discard_keeps_the_row_visible(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    job = insert_job(conn)
    make_dead(conn, job)
    r = client.post(f"/api/v1/dlq/{job}/discard")
    assert r.status_code == 200
    assert (r.json()["id"], r.json()["state"]) == (job, "dead") and r.json()["discarded_at"]
    assert client.get(f"/api/v1/dlq/{job}").json()["discarded"] is True
    assert [j["id"] for j in client.get("/api/v1/dlq", params={"discarded": True}).json()["items"]] == [job]
    assert client.get("/api/v1/dlq", params={"discarded": False}).json()["items"] == []
    again = client.post(f"/api/v1/dlq/{job}/discard")
    assert again.status_code == 409 and again.json()["error"]["message"] == f"job {job} is already discarded"


def test_purge_needs_confirm_and_respects_age_and_queue(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    old = insert_job(conn)
    make_dead(conn, old)
    conn.execute("UPDATE postbox.outbox SET finished_at = now() - interval '2 days' WHERE id = %s", (old,))
    young = insert_job(conn)
    make_dead(conn, young)
    elsewhere = insert_job(conn, queue="other")
    make_dead(conn, elsewhere)
    conn.execute("UPDATE postbox.outbox SET finished_at = now() - interval '2 days' WHERE id = %s", (elsewhere,))
    conn.commit()

    r = client.post("/api/v1/dlq/purge", params={"queue": "apiq", "older_than": 86400})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "code": "CONFIRMATION_REQUIRED",
            "message": "purge deletes 1 dead letters of queue 'apiq' for good: confirm it",
            "details": {"queue": "apiq", "would_purge": 1, "field": "confirm"},
        }
    }
    assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'dead'").fetchone() == (3,)
    conn.commit()
    r = client.post("/api/v1/dlq/purge", params={"queue": "apiq", "older_than": 86400, "confirm": True})
    assert r.status_code == 200 and r.json() == {"queue": "apiq", "purged": 1}
    left = {row[0] for row in conn.execute("SELECT id FROM postbox.outbox").fetchall()}
    assert left == {young, elsewhere}
    assert conn.execute("SELECT count(*) FROM postbox.job_attempts WHERE outbox_id = %s", (old,)).fetchone() == (0,)
    kept = "SELECT count(*) FROM postbox.job_attempts WHERE outbox_id = ANY(%s)"
    assert conn.execute(kept, ([young, elsewhere],)).fetchone() == (4,)  # the purge took only its own jobs' history
    conn.commit()
    # discarded_only: only discarded rows go
    client.post(f"/api/v1/dlq/{young}/discard")
    r = client.post("/api/v1/dlq/purge", params={"queue": "other", "discarded_only": True, "confirm": True})
    assert r.json() == {"queue": "other", "purged": 0}
    r = client.post("/api/v1/dlq/purge", params={"queue": "apiq", "discarded_only": True, "confirm": True})
    assert r.json() == {"queue": "apiq", "purged": 1}
    assert client.post("/api/v1/dlq/purge").status_code == 422  # queue is required
    assert (
        client.post("/api/v1/dlq/purge", params={"queue": "apiq", "older_than": -1, "confirm": True}).status_code == 422
    )
