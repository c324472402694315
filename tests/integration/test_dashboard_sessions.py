"""Dashboard sessions, wrong-key throttling and the read-access model, through the real app (issue 29 items 5, 6).

The app runs on the test's PostgreSQL and Redis behind Starlette's TestClient
(HTTP requests through the ASGI app, its lifespan and middleware); the
throttle's clock is pinned so a test does not wait out a Retry-After.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from postbox.app.api.main import create_app
from postbox.app.dashboard import session
from postbox.registry import default_registry
from postbox.settings import Settings
from tests.harness.api import API_KEY, insert_job, make_dead

SAME_ORIGIN = {"Origin": "http://testserver"}


def _app_client(settings: Settings, base_url: str = "http://testserver", **overrides: Any) -> TestClient:
    update = {"api_key": API_KEY, **overrides}
    app = create_app(settings.model_copy(update=update), registry=default_registry)
    return TestClient(app, base_url=base_url, raise_server_exceptions=False)


def _login(client: TestClient) -> str:
    """Log in; the session token the cookie holds."""
    assert client.post("/ui/login", json={"key": API_KEY}).status_code == 204
    token = client.cookies.get(session.COOKIE) or client.cookies.get(session.SECURE_COOKIE)
    assert token
    return str(token)


def _session_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    rows = conn.execute("SELECT id, token_hash FROM postbox.sessions ORDER BY id").fetchall()
    conn.commit()
    return rows


def _metric(client: TestClient, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start}")


def _audit(conn: psycopg.Connection[Any], action_like: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT actor, action, target, details FROM postbox.audit_log WHERE action LIKE %s ORDER BY id",
        (action_like,),
    ).fetchall()
    conn.commit()
    return rows


@pytest.fixture
def keyed(settings: Settings) -> Iterator[TestClient]:
    with _app_client(settings) as client:
        yield client


def test_the_cookie_holds_a_session_token_not_the_key(keyed: TestClient, conn: psycopg.Connection[Any]) -> None:
    login = keyed.post("/ui/login", json={"key": API_KEY}, headers={"User-Agent": "probe/1"})
    assert login.status_code == 204
    cookie = login.headers["set-cookie"]
    token = keyed.cookies.get(session.COOKIE)
    assert token and API_KEY not in cookie and token != API_KEY and len(token) >= 43
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Domain" not in cookie and "Secure" not in cookie  # plain HTTP: no Secure, no __Host-
    # PostgreSQL holds the token's SHA-256 only
    ((session_id, stored),) = _session_rows(conn)
    assert bytes(stored) == hashlib.sha256(token.encode()).digest()
    state = keyed.get("/ui/session").json()
    assert state["logged_in"] is True and state["csrf"] == session.csrf_token(token)
    # the session acts (with its CSRF token), audited as itself
    paused = keyed.post("/api/v1/queues/apiq/pause", headers={"X-CSRF-Token": state["csrf"], **SAME_ORIGIN})
    assert paused.status_code == 200, paused.text
    actors = conn.execute("SELECT actor, action FROM postbox.audit_log ORDER BY id").fetchall()
    assert actors == [(f"session:{session_id}", "session.login"), (f"session:{session_id}", "queue.pause")]
    # the key itself in the old cookie's place logs no one in
    keyed.cookies.clear()
    keyed.cookies.set(session.COOKIE, API_KEY)
    assert keyed.get("/ui/session").json()["logged_in"] is False


def test_over_https_the_cookie_is_host_only_secure_with_the_host_prefix(settings: Settings) -> None:
    with _app_client(settings, base_url="https://testserver") as client:
        cookie = client.post("/ui/login", json={"key": API_KEY}).headers["set-cookie"]
        assert cookie.startswith(session.SECURE_COOKIE + "=")
        assert "Secure" in cookie and "Path=/;" in cookie and "Domain" not in cookie and "HttpOnly" in cookie
        assert client.get("/ui/session").json()["logged_in"] is True


def test_behind_a_trusted_proxy_the_forwarded_scheme_and_client_count(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    # TestClient's peer is "testclient", not an address: trust it as a literal to stand for the proxy.
    app = create_app(settings.model_copy(update={"api_key": API_KEY}), registry=default_registry)
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    with TestClient(ProxyHeadersMiddleware(app, trusted_hosts="testclient"), raise_server_exceptions=False) as client:
        forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
        login = client.post("/ui/login", json={"key": API_KEY}, headers=forwarded)
        assert login.headers["set-cookie"].startswith(session.SECURE_COOKIE + "=")
    assert conn.execute("SELECT client FROM postbox.sessions").fetchall() == [("203.0.113.9",)]


def test_a_revoked_session_is_refused(keyed: TestClient, conn: psycopg.Connection[Any]) -> None:
    token = _login(keyed)
    ((session_id, _),) = _session_rows(conn)
    listed = keyed.get("/api/v1/sessions", headers={"X-API-Key": API_KEY}).json()
    assert [(s["id"], s["valid"], s["current"]) for s in listed] == [(session_id, True, False)]
    assert keyed.get("/api/v1/sessions").json()[0]["current"] is True  # through the cookie: this one
    assert TestClient(keyed.app).get("/api/v1/sessions").status_code == 401  # no cookie, no key
    revoked = keyed.delete(f"/api/v1/sessions/{session_id}", headers={"X-API-Key": API_KEY})
    assert revoked.json() == {"revoked": 1}
    assert keyed.get("/ui/session").json()["logged_in"] is False
    refused = keyed.post(
        "/api/v1/queues/apiq/pause", headers={"X-CSRF-Token": session.csrf_token(token), **SAME_ORIGIN}
    )
    assert refused.status_code == 401
    assert _session_rows(conn) == []
    assert _audit(conn, "session.revoke") == [("api:key", "session.revoke", f"session:{session_id}", {})]


def test_a_new_key_ends_every_session(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    with _app_client(settings) as client:
        token = _login(client)
    with _app_client(settings, api_key="the-next-key") as client:
        client.cookies.set(session.COOKIE, token)
        assert client.get("/ui/session").json()["logged_in"] is False
        assert client.get("/api/v1/audit").status_code == 401
        listed = client.get("/api/v1/sessions", headers={"X-API-Key": "the-next-key"}).json()
        assert [s["valid"] for s in listed] == [False]


def test_logout_needs_the_csrf_token_and_ends_the_session(keyed: TestClient, conn: psycopg.Connection[Any]) -> None:
    token = _login(keyed)
    # A cross-origin form: with the cookie (no SameSite in play), without it; neither logs out.
    forged = keyed.post("/ui/logout", headers={"Origin": "http://evil.example"})
    assert forged.status_code == 403 and "set-cookie" not in forged.headers
    no_token = keyed.post("/ui/logout", headers=SAME_ORIGIN)
    assert no_token.status_code == 403
    bare = TestClient(keyed.app, raise_server_exceptions=False)
    cross = bare.post("/ui/logout", headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    assert len(_session_rows(conn)) == 1 and keyed.get("/ui/session").json()["logged_in"] is True
    # The page's own logout: the row is deleted, the cookie cleared.
    out = keyed.post("/ui/logout", headers={"X-CSRF-Token": session.csrf_token(token), **SAME_ORIGIN})
    assert out.status_code == 204 and f'{session.COOKIE}=""' in out.headers["set-cookie"]
    assert _session_rows(conn) == []
    assert [a[1] for a in _audit(conn, "session.%")] == ["session.login", "session.logout"]


def test_wrong_keys_are_throttled_with_retry_after_counted_and_audited(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    now = [1000.0]
    with _app_client(settings, api_auth_burst=3, api_auth_refill=20.0) as client:
        client.app.state.postbox.throttle.clock = lambda: now[0]  # type: ignore[attr-defined]
        wrong = {"X-API-Key": "guess"}
        assert [client.get("/api/v1/queues", headers=wrong).status_code for _ in range(3)] == [401, 401, 401]
        for headers in (wrong, {"X-API-Key": API_KEY}):  # out of tries: any key is refused
            refused = client.get("/api/v1/queues", headers=headers)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "20"
            assert refused.json()["error"]["code"] == "TOO_MANY_AUTH_FAILURES"
        login = client.post("/ui/login", json={"key": API_KEY})
        assert login.status_code == 429 and login.headers["retry-after"] == "20"
        assert client.get("/api/v1/queues").status_code == 200  # without a key: not throttled
        now[0] += 5
        assert client.get("/api/v1/queues", headers=wrong).headers["retry-after"] == "15"
        assert _metric(client, 'postbox_api_auth_throttled_total{surface="api"}') == 3
        assert _metric(client, 'postbox_api_auth_throttled_total{surface="login"}') == 1
        assert _metric(client, 'postbox_api_auth_failures_total{reason="invalid"}') == 3
        now[0] += 15  # one try back
        assert client.get("/api/v1/queues", headers={"X-API-Key": API_KEY}).status_code == 200
        assert client.post("/ui/login", json={"key": "guess"}).status_code == 401  # the regained try, spent
        assert client.post("/ui/login", json={"key": API_KEY}).status_code == 429
    rows = _audit(conn, "auth.%")
    assert [(actor, action, target) for actor, action, target, _ in rows] == [
        ("unauthenticated", "auth.failed", "client:testclient")
    ] * 4
    assert [(d["surface"], d["throttled"]) for *_, d in rows] == [
        ("api", False),
        ("api", False),
        ("api", True),
        ("login", True),
    ]


def test_without_the_key_sensitive_reads_are_withheld(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    job = insert_job(conn, dedup_key="alice@example.org", args='{"email": "alice@example.org"}')
    make_dead(conn, job, error="no mailbox alice@example.org")
    conn.execute(
        "UPDATE postbox.job_attempts SET traceback = 'Traceback: alice@example.org' WHERE outbox_id = %s", (job,)
    )
    conn.execute(
        "INSERT INTO postbox.workers (id, host, pid, queues, concurrency) VALUES ('w1', 'db-host-7', 4242, '{apiq}', 1)"
    )
    conn.commit()
    key = {"X-API-Key": API_KEY}
    with _app_client(settings) as client:
        assert client.get("/api/v1/audit").status_code == 401
        assert client.get("/api/v1/audit", headers=key).status_code == 200
        for path in (f"/api/v1/jobs/{job}", f"/api/v1/dlq/{job}", f"/api/v1/dashboard/jobs/{job}"):
            open_ = client.get(path).json()
            assert (open_["dedup_key"], open_["last_error"], open_["args"], open_["redacted"]) == (None,) * 3 + (True,)
            assert [(a["error"], a["traceback"]) for a in open_["history"]] == [(None, None), (None, None)]
            keyed = client.get(path, headers=key).json()
            assert keyed["dedup_key"] == "alice@example.org" and "alice" in keyed["last_error"]
            assert keyed["history"][-1]["traceback"] == "Traceback: alice@example.org"
        for path in ("/api/v1/jobs", "/api/v1/dlq", "/api/v1/dashboard/jobs"):
            (item,) = [i for i in client.get(path).json()["items"] if i["id"] == job]
            assert (item["dedup_key"], item["last_error"]) == (None, None), path
            (item,) = [i for i in client.get(path, headers=key).json()["items"] if i["id"] == job]
            assert item["dedup_key"] == "alice@example.org", path
        (worker,) = client.get("/api/v1/workers").json()
        assert (worker["host"], worker["pid"]) == (None, None)
        assert client.get("/api/v1/workers/w1").json()["host"] is None
        assert client.get("/api/v1/workers/w1", headers=key).json()["pid"] == 4242
        # health, readiness and metrics stay open
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
        assert client.get("/metrics").status_code == 200
    with _app_client(settings, api_key_for_all=True) as client:
        assert client.get("/api/v1/jobs").status_code == 401
        assert client.get("/metrics").status_code == 200
