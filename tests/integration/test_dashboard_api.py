"""The dashboard's endpoints without a browser: search, count, bulk actions, the cookie session and CSRF.

The browser tests (tests/system/test_dashboard.py) drive the pages; these pin the
edges: windows of a text search, the count's cap, refusals in bulk, the cookie's
attributes under a path prefix, and what the middleware lets through.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from postbox.app.api.main import create_app
from postbox.app.dashboard import queries, search, session
from postbox.registry import default_registry
from postbox.settings import Settings
from tests.harness.api import API_KEY, audit_rows, insert_job, job_state, make_client, make_dead


def _login(client: TestClient) -> str:
    assert client.post("/ui/login", json={"key": API_KEY}).status_code == 204
    state = client.get("/ui/session").json()
    assert state["logged_in"] is True
    return str(state["csrf"])


def test_the_page_and_its_assets_are_served(settings: Settings) -> None:
    with make_client(settings) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert 'src="static/app.js"' in page.text and 'href="static/style.css"' in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert client.get("/static/app.js").headers["content-type"] == "text/javascript; charset=utf-8"
        assert client.get("/static/../main.py").status_code == 404
        assert client.get("/static/index.py").status_code == 404


def test_text_search_pages_through_windows_of_ids(
    settings: Settings, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search, "TEXT_WINDOW", 10)
    monkeypatch.setattr("postbox.app.dashboard.views.TEXT_WINDOW", 10)
    ids = [insert_job(conn, args=json.dumps({"text": "needle" if i in (2, 25) else "hay"})) for i in range(30)]
    with make_client(settings, api_key=API_KEY) as client:
        refused = client.get("/api/v1/dashboard/jobs", params={"text": "needle"})
        assert refused.status_code == 403
        headers = {"X-API-Key": API_KEY}
        first = client.get("/api/v1/dashboard/jobs", params={"text": "needle"}, headers=headers).json()
        assert [j["id"] for j in first["items"]] == [ids[25]]
        assert first["searched_down_to"] == ids[-1] + 1 - 10
        second = client.get(
            "/api/v1/dashboard/jobs", params={"text": "needle", "cursor": first["next_cursor"]}, headers=headers
        ).json()
        assert second["items"] == [] and second["searched_down_to"] == ids[-1] + 1 - 20
        third = client.get(
            "/api/v1/dashboard/jobs", params={"text": "needle", "cursor": second["next_cursor"]}, headers=headers
        ).json()
        assert [j["id"] for j in third["items"]] == [ids[2]]
        # % and _ are matched literally
        assert client.get("/api/v1/dashboard/jobs", params={"text": "n%e"}, headers=headers).json()["items"] == []
        # "select all matching" counts in the newest window only, says so, and a bulk action takes the same jobs
        assert client.get("/api/v1/dashboard/jobs/count", params={"text": "needle"}, headers=headers).json() == {
            "count": 1,
            "more": False,
            "limit": search.BULK_MAX,
            "searched_down_to": ids[-1] + 1 - 10,
        }
        until = client.get(
            "/api/v1/dashboard/jobs/count", params={"text": "needle", "until": "2100-01-01T00:00:00Z"}, headers=headers
        ).json()
        assert (until["count"], until["searched_down_to"]) == (1, ids[-1] + 1 - 10)
        cancelled = client.post("/api/v1/bulk/cancel", json={"filter": {"text": "needle"}}, headers=headers).json()
        assert cancelled["done_ids"] == [ids[25]]
    assert job_state(conn, ids[2]) == "pending"


def test_filters_and_the_capped_count(
    settings: Settings, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("postbox.app.dashboard.views.BULK_MAX", 3)
    old = insert_job(conn, created_at="2026-01-01T00:00:00Z")
    new = [insert_job(conn, task="api_sum", queue="other") for _ in range(4)]
    with make_client(settings) as client:
        found = client.get("/api/v1/dashboard/jobs", params={"until": "2026-06-01T00:00:00Z"}).json()
        assert [j["id"] for j in found["items"]] == [old]
        found = client.get("/api/v1/dashboard/jobs", params={"task": "api_sum", "limit": 3}).json()
        assert [j["id"] for j in found["items"]] == new[::-1][:3] and found["next_cursor"] is not None
        assert client.get("/api/v1/dashboard/jobs/count", params={"queue": "other"}).json() == {
            "count": 3,
            "more": True,
            "limit": 3,
            "searched_down_to": None,
        }
        assert client.get("/api/v1/dashboard/jobs/count", params={"queue": "apiq"}).json()["count"] == 1
        # a state without a queue goes through every queue's names (queue = ANY(...)): all of them
        by_state = client.get("/api/v1/dashboard/jobs", params={"state": "pending"}).json()
        assert [j["id"] for j in by_state["items"]] == [*new[::-1], old]
        naive = client.get("/api/v1/dashboard/jobs", params={"since": "2026-01-01T00:00:00"})
        assert naive.status_code == 400 and naive.json()["error"]["details"]["field"] == "since"


def test_a_creation_time_bound_becomes_an_id_bound_found_by_binary_search(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    base = datetime(2026, 3, 1, tzinfo=UTC)
    ids = [insert_job(conn, created_at=base + timedelta(hours=i)) for i in range(12)]
    conn.execute("DELETE FROM postbox.outbox WHERE id = ANY(%s)", ([ids[2], ids[3], ids[7]],))  # gaps in the ids
    conn.commit()
    kept = [job_id for i, job_id in enumerate(ids) if i not in (2, 3, 7)]
    id_at = queries.statements("postbox").ID_AT
    for hours in range(-1, 13):
        at = base + timedelta(hours=hours, minutes=-30)
        row = conn.execute(id_at, {"at": at}).fetchone()
        assert row is not None
        # every job below the id is older, every job from it on is not (deleted ids may fall either side)
        assert [job_id >= row[0] for job_id in kept] == [i >= hours for i, job_id in enumerate(ids) if job_id in kept]
        assert row[0] <= ids[-1] + 1
    # A job whose (long) transaction began 2 minutes before its predecessor's: within the slack.
    late = insert_job(conn, created_at=base + timedelta(hours=11, minutes=-2))
    with make_client(settings) as client:

        def found(**params: str) -> list[int]:
            page = client.get("/api/v1/dashboard/jobs", params={**params, "limit": "100"}).json()
            return [j["id"] for j in page["items"]]

        def counted(**params: str) -> int:
            return int(client.get("/api/v1/dashboard/jobs/count", params=params).json()["count"])

        four, ten, eleven = (str(base + timedelta(hours=h)).replace(" ", "T") for h in (4, 10, 11))
        assert found(until=four) == [ids[1], ids[0]]
        assert found(since=four) == [late, ids[11], ids[10], ids[9], ids[8], ids[6], ids[5], ids[4]]
        assert found(since=four, until=ten) == [ids[9], ids[8], ids[6], ids[5], ids[4]]
        assert found(until=eleven) == [late, *kept[-2::-1]]
        assert (counted(until=four), counted(since=four), counted(until=eleven)) == (2, 8, 9)
        assert found(since=eleven) == [ids[11]]


def test_bulk_by_ids_and_by_filter_each_audited_refusals_counted(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    dead = [insert_job(conn, args=json.dumps({"n": i})) for i in range(3)]
    for job_id in dead:
        make_dead(conn, job_id)
    done = insert_job(conn, state="succeeded")
    with make_client(settings, api_key=API_KEY) as client:
        headers = {"X-API-Key": API_KEY}
        assert client.post("/api/v1/bulk/requeue", json={"ids": dead[:1]}).status_code == 401
        one = client.post("/api/v1/bulk/requeue", json={"ids": [dead[0], done]}, headers=headers).json()
        assert one == {"action": "requeue", "matched": 2, "done": 1, "skipped": {"CONFLICT": 1}, "done_ids": [dead[0]]}
        by_filter = client.post(
            "/api/v1/bulk/discard", json={"filter": {"state": "dead", "queue": "apiq"}}, headers=headers
        ).json()
        assert by_filter["done_ids"] == [dead[2], dead[1]] and by_filter["skipped"] == {}
        both = client.post("/api/v1/bulk/cancel", json={"ids": [1], "filter": {}}, headers=headers)
        assert both.status_code == 422
    assert job_state(conn, dead[0]) == "pending"
    assert [(r[0], r[1], r[2]) for r in audit_rows(conn)] == [
        ("api:key", "dlq.requeue", f"job:{dead[0]}"),
        ("api:key", "dlq.discard", f"job:{dead[2]}"),
        ("api:key", "dlq.discard", f"job:{dead[1]}"),
    ]


def test_login_cookie_csrf_and_logout_under_a_path_prefix(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    app = create_app(settings.model_copy(update={"api_key": API_KEY}), registry=default_registry)
    with TestClient(app, root_path="/ops", raise_server_exceptions=False) as client:
        assert client.post("/ui/login", json={"key": "nope"}).status_code == 401
        login = client.post("/ui/login", json={"key": API_KEY})
        assert login.status_code == 204
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ops/" in cookie
        token = client.cookies.get(session.COOKIE)
        assert token and token != API_KEY
        client.cookies.clear()  # TestClient's URLs lack the prefix the proxy would add: send it everywhere
        client.cookies.set(session.COOKIE, token)
        csrf = client.get("/ui/session").json()["csrf"]
        assert csrf == session.csrf_token(token)
        # the cookie reads (args unredacted) ...
        job_id = insert_job(conn, args='{"secret": 1}')
        assert client.get(f"/api/v1/jobs/{job_id}").json()["args"] == {"secret": 1}
        # ... but acts only with the CSRF token, from this origin
        assert client.post("/api/v1/queues/apiq/pause").json()["error"]["code"] == "CSRF_FAILED"
        forged = client.post(
            "/api/v1/queues/apiq/pause", headers={"X-CSRF-Token": csrf, "Origin": "http://evil.example"}
        )
        assert forged.status_code == 403
        paused = client.post("/api/v1/queues/apiq/pause", headers={"X-CSRF-Token": csrf})
        assert paused.status_code == 200 and paused.json()["paused"] is True
        # a cookie with an unknown token is ignored, not an error
        client.cookies.set(session.COOKIE, "not-a-session")
        assert client.get("/ui/session").json()["logged_in"] is False
        assert client.get(f"/api/v1/jobs/{job_id}").json()["args"] is None
        out = client.post("/ui/logout", headers={"Origin": "http://testserver"})
        assert out.status_code == 204 and 'postbox_session=""' in out.headers["set-cookie"]
    assert [r[1] for r in audit_rows(conn)] == ["auth.failed", "session.login", "queue.pause"]


def test_login_without_a_configured_key_is_refused(settings: Settings) -> None:
    with make_client(settings) as client:
        refused = client.post("/ui/login", json={"key": "anything"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "NO_API_KEY"
        assert client.get("/ui/session").json() == {
            "mode": "insecure",
            "logged_in": False,
            "csrf": None,
            "can_act": True,
            "can_read_args": True,
            "reads_need_key": False,
        }


def test_queue_counts_are_those_of_the_rest_api(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    """The dashboard counts per queue through the index; the numbers are GET /api/v1/queues' own."""
    for state in ("pending", "queued", "running", "retrying", "succeeded", "cancelled"):
        insert_job(conn, state=state)
        insert_job(conn, queue="other", state=state, available_at="2030-01-01T00:00:00Z")
    insert_job(conn, state="retrying", published_at="2026-01-01T00:00:00Z")
    for discarded in (None, "2026-01-01T00:00:00Z"):
        make_dead(conn, insert_job(conn, queue="other"))
        conn.execute(
            "UPDATE postbox.outbox SET discarded_at = %s WHERE id = (SELECT max(id) FROM postbox.outbox)", (discarded,)
        )
    insert_job(conn, queue="donequeue", state="succeeded")
    conn.commit()
    with make_client(settings) as client:
        assert client.post("/api/v1/queues/idle/pause").status_code == 200
        rest = {q["queue"]: q for q in client.get("/api/v1/queues").json()}
        mine = {q["queue"]: q for q in client.get("/api/v1/dashboard/queues").json()}
    for stats in (*rest.values(), *mine.values()):
        stats.pop("oldest_waiting_seconds")  # read a moment apart
    # a queue holding only finished jobs is listed too (with zeros); the rest is identical
    assert mine.pop("donequeue")["backlog"] == 0
    assert mine == rest
    assert {"apiq", "idle", "other"} <= set(rest) and "donequeue" not in rest
    assert (rest["other"]["scheduled"], rest["other"]["dead"], rest["other"]["discarded"]) == (1, 1, 1)
    assert (rest["apiq"]["backlog"], rest["apiq"]["retrying"]) == (2, 2)


def test_with_the_key_needed_for_reads_the_cookie_opens_reads_and_the_websocket(settings: Settings) -> None:
    with make_client(settings, api_key=API_KEY, api_key_for_all=True) as client:
        assert client.get("/ui/session").json()["reads_need_key"] is True
        assert client.get("/api/v1/dashboard/overview").status_code == 401
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/ws/events"):
            pass
        assert client.post("/ui/login", json={"key": API_KEY}).status_code == 204
        assert client.get("/api/v1/dashboard/overview").status_code == 200
        with client.websocket_connect("/ws/events", headers={"host": "testserver", "origin": "http://testserver"}):
            pass  # accepted
        with (
            pytest.raises(WebSocketDisconnect),
            client.websocket_connect("/ws/events", headers={"origin": "http://evil.example"}),
        ):
            pass


def test_bulk_cancel_by_filter_cancels_the_waiting_jobs_and_skips_the_finished(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    waiting = [insert_job(conn, task="api_sum") for _ in range(2)]
    finished = insert_job(conn, task="api_sum", state="succeeded")
    other = insert_job(conn, task="api_echo")
    with make_client(settings, api_key=API_KEY) as client:
        done = client.post(
            "/api/v1/bulk/cancel", json={"filter": {"task": "api_sum"}}, headers={"X-API-Key": API_KEY}
        ).json()
    assert done == {
        "action": "cancel",
        "matched": 3,
        "done": 2,
        "skipped": {"CONFLICT": 1},
        "done_ids": [waiting[1], waiting[0]],
    }
    assert [job_state(conn, j) for j in (*waiting, finished, other)] == [
        "cancelled",
        "cancelled",
        "succeeded",
        "pending",
    ]
    assert [(r[1], r[2]) for r in audit_rows(conn)] == [("job.cancel", f"job:{j}") for j in waiting[::-1]]
