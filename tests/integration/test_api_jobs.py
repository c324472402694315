"""REST: enqueue, get, list, result and cancel — success and error paths with exact bodies."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from fastapi.testclient import TestClient

from postbox.settings import Settings
from tests.harness.api import client_fixture, insert_job, job_state, make_client  # noqa: F401


def test_enqueue_returns_201_with_the_job(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    r = client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": 2, "b": 3}, "priority": 8})
    assert r.status_code == 201
    body = r.json()
    assert body["task"] == "api_sum"
    assert body["queue"] == "apiq"
    assert body["priority"] == 8
    assert body["state"] == "pending"
    assert body["attempts"] == 0
    assert body["args"] == {"a": 2, "b": 3}
    assert body["history"] == []
    assert body["duplicate"] is False
    assert r.headers["x-request-id"]
    row = conn.execute("SELECT task, queue, priority, args FROM postbox.outbox WHERE id = %s", (body["id"],)).fetchone()
    assert row == ("api_sum", "apiq", 8, {"a": 2, "b": 3})


def test_enqueue_answer_is_the_job_as_stored(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    """The one-statement insert (no dedup key, no unique rule) answers with the row as GET reads it back."""
    r = client.post(
        "/api/v1/jobs",
        json={"task": "api_sum", "args": {"a": 1, "b": 1}, "delay_seconds": 30, "max_attempts": 2, "keep_result": True},
    )
    assert r.status_code == 201
    posted = r.json()
    got = client.get(f"/api/v1/jobs/{posted['id']}").json()
    assert {k: v for k, v in posted.items() if k != "duplicate"} == got
    assert posted["max_attempts"] == 2 and posted["keep_result"] is True and posted["published_at"] is None
    created, available = conn.execute(
        "SELECT created_at, available_at FROM postbox.outbox WHERE id = %s", (posted["id"],)
    ).fetchone() or (None, None)
    assert created is not None and available is not None
    assert (available - created).total_seconds() == 30  # the delay as the database applied it


def test_idempotency_key_wins_over_dedup_key(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    first = client.post(
        "/api/v1/jobs", json={"task": "api_echo", "dedup_key": "body-key"}, headers={"Idempotency-Key": "hdr-key"}
    )
    assert first.status_code == 201
    assert first.json()["dedup_key"] == "hdr-key"
    again = client.post(
        "/api/v1/jobs", json={"task": "api_echo", "dedup_key": "other"}, headers={"Idempotency-Key": "hdr-key"}
    )
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["duplicate"] is True
    by_body = client.post("/api/v1/jobs", json={"task": "api_echo", "dedup_key": "hdr-key"})
    assert by_body.status_code == 200 and by_body.json()["id"] == first.json()["id"]
    assert conn.execute("SELECT id, task, dedup_key, state FROM postbox.outbox").fetchall() == [
        (first.json()["id"], "api_echo", "hdr-key", "pending")
    ]


def test_unknown_task_is_400_naming_the_field(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    r = client.post("/api/v1/jobs", json={"task": "nope", "args": {}})
    assert r.status_code == 400
    assert r.json() == {
        "error": {"code": "UNKNOWN_TASK", "message": "unknown task 'nope'", "details": {"field": "task"}}
    }
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)


def test_bad_args_are_422_naming_the_field(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    r = client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": "not a number"}})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "INVALID_ARGS"
    assert err["details"]["field"] == "args.a"
    r = client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": 1, "zzz": 1}})
    assert r.status_code == 422 and r.json()["error"]["details"]["field"] == "args.zzz"
    r = client.post("/api/v1/jobs", json={"task": "api_echo", "args": {"text": "a\u0000b"}})
    assert r.status_code == 422 and r.json()["error"]["details"]["field"] == "args.text"
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)


def test_body_validation_is_422_in_the_error_shape(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json={"task": "api_echo", "priority": 12})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "VALIDATION_ERROR"
    assert err["details"]["field"] == "priority"
    assert err["message"].startswith("priority: ")
    r = client.post("/api/v1/jobs", json={"task": "api_echo", "bogus": 1})
    assert r.status_code == 422 and r.json()["error"]["details"]["field"] == "bogus"
    r = client.post("/api/v1/jobs", json={"task": "api_echo", "delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID_SCHEDULE"
    r = client.post("/api/v1/jobs", content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "VALIDATION_ERROR"


def test_payload_over_the_limit_is_413(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    with make_client(settings, max_payload_bytes=100) as c:
        r = c.post("/api/v1/jobs", json={"task": "api_echo", "args": {"text": "x" * 200}})
        assert r.status_code == 413
        err = r.json()["error"]
        assert err["code"] == "PAYLOAD_TOO_LARGE"
        assert err["details"] == {"size": 211, "limit": 100, "field": "args"}
        huge = c.post("/api/v1/jobs", json={"task": "api_echo", "args": {"text": "x" * 70_000}})
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)


def test_queue_full_is_429_with_retry_after(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    with make_client(settings, max_queue_depth=2) as c:
        assert c.post("/api/v1/jobs", json={"task": "api_echo"}).status_code == 201
        assert c.post("/api/v1/jobs", json={"task": "api_echo", "dedup_key": "k"}).status_code == 201
        r = c.post("/api/v1/jobs", json={"task": "api_echo"})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "5"
        assert r.json() == {
            "error": {
                "code": "QUEUE_FULL",
                "message": "queue 'apiq' holds 2 waiting jobs (limit 2)",
                "details": {"queue": "apiq", "limit": 2},
            }
        }
        # an existing key is still answered; another queue is not limited by this one
        assert c.post("/api/v1/jobs", json={"task": "api_echo", "dedup_key": "k"}).status_code == 200
        assert c.post("/api/v1/jobs", json={"task": "api_echo", "queue": "other"}).status_code == 201
        conn.execute("UPDATE postbox.outbox SET state = 'succeeded' WHERE queue = 'apiq' AND dedup_key = 'k'")
        conn.commit()
        assert c.post("/api/v1/jobs", json={"task": "api_echo"}).status_code == 201
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (4,)


def test_get_job_with_history_and_404(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    job_id = insert_job(conn, state="running", attempts=1, claimed_by="worker-0000abcd")
    conn.execute(
        "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id) VALUES (%s, 1, 'worker-0000abcd')", (job_id,)
    )
    conn.commit()
    r = client.get(f"/api/v1/jobs/{job_id}")
    assert r.status_code == 200
    body = r.json()
    assert body["state"] == "running" and body["worker_id"] == "worker-0000abcd"
    assert len(body["history"]) == 1
    entry = body["history"][0]
    assert (entry["attempt"], entry["life"], entry["worker_id"], entry["outcome"]) == (1, 1, "worker-0000abcd", None)
    missing = client.get("/api/v1/jobs/999999")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "NOT_FOUND", "message": "job 999999 not found", "details": {"id": 999999}}
    }
    bad = client.get("/api/v1/jobs/0")
    assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "job_id"
    assert client.get("/api/v1/jobs/abc").status_code == 422


def test_history_shows_the_running_attempt_from_the_outbox_row(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    """An attempt's history row is written when it ends; until then the outbox row stands for it."""
    job_id = insert_job(conn, state="running", attempts=2, claimed_by="worker-0000beef")
    conn.execute("UPDATE postbox.outbox SET started_at = now() WHERE id = %s", (job_id,))
    conn.execute(
        "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, started_at, finished_at, outcome)"
        " VALUES (%s, 1, 'worker-0000dead', now() - interval '1 minute', now() - interval '30 s', 'lost')",
        (job_id,),
    )
    conn.commit()
    history = client.get(f"/api/v1/jobs/{job_id}").json()["history"]
    assert [(h["attempt"], h["worker_id"], h["outcome"], h["finished_at"] is None) for h in history] == [
        (1, "worker-0000dead", "lost", False),
        (2, "worker-0000beef", None, True),
    ]


def test_list_newest_first_with_cursor_and_filters(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    ids = [insert_job(conn) for _ in range(5)]
    other = insert_job(conn, task="api_sum", queue="other", state="dead")
    first = client.get("/api/v1/jobs", params={"limit": 2, "queue": "apiq"})
    assert first.status_code == 200
    assert [j["id"] for j in first.json()["items"]] == [ids[4], ids[3]]
    cursor = first.json()["next_cursor"]
    second = client.get("/api/v1/jobs", params={"limit": 2, "queue": "apiq", "cursor": cursor}).json()
    assert [j["id"] for j in second["items"]] == [ids[2], ids[1]]
    third = client.get("/api/v1/jobs", params={"limit": 2, "queue": "apiq", "cursor": second["next_cursor"]}).json()
    assert [j["id"] for j in third["items"]] == [ids[0]]
    assert third["next_cursor"] is None
    assert [j["id"] for j in client.get("/api/v1/jobs", params={"state": "dead"}).json()["items"]] == [other]
    assert [j["id"] for j in client.get("/api/v1/jobs", params={"task": "api_sum"}).json()["items"]] == [other]
    assert len(client.get("/api/v1/jobs").json()["items"]) == 6
    bad = client.get("/api/v1/jobs", params={"cursor": "garbage"})
    assert bad.status_code == 400
    assert bad.json() == {
        "error": {
            "code": "INVALID_REQUEST",
            "message": "cursor is not one this API returned",
            "details": {"field": "cursor"},
        }
    }
    assert client.get("/api/v1/jobs", params={"state": "bogus"}).status_code == 422
    assert client.get("/api/v1/jobs", params={"limit": 0}).status_code == 422
    assert client.get("/api/v1/jobs", params={"queue": "Bad Queue"}).status_code == 422


def test_cancel_paths(client: TestClient, conn: psycopg.Connection[Any], redis_url: str, settings: Settings) -> None:
    pending = insert_job(conn)
    running = insert_job(conn, state="running", attempts=1)
    done = insert_job(conn, state="succeeded", attempts=1)
    r = client.post(f"/api/v1/jobs/{pending}/cancel")
    assert r.status_code == 202
    assert r.json() == {
        "id": pending,
        "queue": "apiq",
        "task": "api_echo",
        "state": "cancelled",
        "cancel_requested": False,
    }
    assert job_state(conn, pending) == "cancelled"
    r = client.post(f"/api/v1/jobs/{running}/cancel")
    assert r.status_code == 202
    assert r.json() == {
        "id": running,
        "queue": "apiq",
        "task": "api_echo",
        "state": "running",
        "cancel_requested": True,
    }
    row = conn.execute(
        "SELECT state, cancel_requested_at IS NOT NULL FROM postbox.outbox WHERE id = %s", (running,)
    ).fetchone()
    assert row == ("running", True)
    conflict = client.post(f"/api/v1/jobs/{done}/cancel")
    assert conflict.status_code == 409
    assert conflict.json() == {
        "error": {
            "code": "CONFLICT",
            "message": f"job {done} is already succeeded",
            "details": {"id": done, "state": "succeeded"},
        }
    }
    again = client.post(f"/api/v1/jobs/{pending}/cancel")
    assert again.status_code == 409 and again.json()["error"]["details"]["state"] == "cancelled"
    missing = client.post("/api/v1/jobs/424242/cancel")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    conn.commit()
    audits = conn.execute("SELECT action, target FROM postbox.audit_log ORDER BY id").fetchall()
    assert audits == [("job.cancel", f"job:{pending}"), ("job.cancel", f"job:{running}")]


def test_result_immediate_and_waiting(client: TestClient, conn: psycopg.Connection[Any], settings: Settings) -> None:
    done = insert_job(conn, state="succeeded", attempts=1, keep_result=True, result='{"v": 1}')
    r = client.get(f"/api/v1/jobs/{done}/result")
    assert r.status_code == 200
    assert r.json() == {
        "id": done,
        "state": "succeeded",
        "finished": True,
        "result": {"v": 1},
        "error_class": None,
        "error": None,
        "redacted": False,
    }
    waiting = insert_job(conn)
    r = client.get(f"/api/v1/jobs/{waiting}/result", params={"wait": 0})
    assert r.json()["finished"] is False and r.json()["state"] == "pending"
    assert client.get("/api/v1/jobs/777777/result").status_code == 404
    assert client.get("/api/v1/jobs/777777/result", params={"wait": 1}).status_code == 404
    started = time.monotonic()
    timed_out = client.get(f"/api/v1/jobs/{waiting}/result", params={"wait": 0.5})
    assert time.monotonic() - started >= 0.5
    assert timed_out.status_code == 200 and timed_out.json()["finished"] is False
    assert client.get(f"/api/v1/jobs/{waiting}/result", params={"wait": 61}).status_code == 422

    def finish() -> None:
        # the "worker": record the outcome and notify waiters in the same transaction
        with psycopg.connect(str(settings.database_url)) as c2:
            c2.execute(
                "UPDATE postbox.outbox SET state = 'dead', last_error_class = 'PermanentError', last_error = 'no'"
                " WHERE id = %s",
                (waiting,),
            )
            c2.execute("SELECT pg_notify('postbox_results', %s)", (f"1,{waiting}",))

    timer = threading.Timer(0.5, finish)
    started = time.monotonic()
    timer.start()
    try:
        r = client.get(f"/api/v1/jobs/{waiting}/result", params={"wait": 20})
    finally:
        timer.join()
    assert time.monotonic() - started < 5
    assert r.json() == {
        "id": waiting,
        "state": "dead",
        "finished": True,
        "result": None,
        "error_class": "PermanentError",
        "error": "no",
        "redacted": False,
    }


def test_unknown_route_and_method_use_the_error_shape(client: TestClient) -> None:
    r = client.get("/api/v1/nothing-here")
    assert r.status_code == 404
    assert r.json() == {"error": {"code": "NOT_FOUND", "message": "no route GET /api/v1/nothing-here", "details": {}}}
    r = client.delete("/api/v1/jobs")
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
