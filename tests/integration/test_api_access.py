"""The API's access policy by default: destructive calls need a key, args need a key, failures counted.

Without POSTBOX_API_KEY a destructive call is refused (403) unless insecure mode
is asked for; job args and results are redacted unless the key is sent (or
POSTBOX_API_PUBLIC_ARGS=true); a wrong key is a 401 on every route; every
route under /api/v1 (the Stagedoor ones too) follows one policy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from postbox.app.api.state import key_matches, start_warnings
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings
from postbox_examples.stagedoor.cli import create_demo_app
from tests.harness.api import API_KEY, audit_rows, insert_job, make_client, make_dead
from tests.integration.test_api_auth import _cancel, _discard, _pause, _purge, _requeue, _resume

Setup = Callable[[psycopg.Connection[Any]], tuple[str, dict[str, Any], str, str]]
SECURE = {"api_insecure": False}  # the default; make_client's development default is insecure


def _failures(client: TestClient, reason: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'postbox_api_auth_failures_total{{reason="{reason}"}} '):
            return float(line.split()[-1])
    raise AssertionError("no postbox_api_auth_failures_total series for " + reason)


@pytest.mark.parametrize("setup", [_cancel, _pause, _resume, _requeue, _discard, _purge])
def test_without_a_key_destructive_calls_are_refused_by_default(
    setup: Setup, settings: Settings, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    path, params, _, _ = setup(conn)
    dead_before = conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'dead'").fetchone()
    conn.commit()
    with make_client(settings, **SECURE) as c, caplog.at_level(logging.WARNING, logger="postbox.app.api"):
        r = c.post(path, params=params, headers={"X-API-Key": "anything"})  # no key configured: ignored
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "FORBIDDEN"
        assert "POSTBOX_API_KEY" in r.json()["error"]["message"]
        assert _failures(c, "no_key_configured") == 1.0
    assert audit_rows(conn) == []
    assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'dead'").fetchone() == dead_before
    conn.commit()
    refused = [r for r in caplog.records if r.getMessage() == "authentication failed"]
    assert [(r.reason, r.path) for r in refused] == [("no_key_configured", path)]  # type: ignore[attr-defined]
    assert "anything" not in caplog.text


def test_args_and_results_are_redacted_without_the_key(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    job = insert_job(conn, args='{"email": "a@example.org"}')
    dead = insert_job(conn, args='{"email": "b@example.org"}')
    make_dead(conn, dead)
    for overrides in (SECURE, {"api_key": API_KEY}):
        with make_client(settings, **overrides) as c:
            got = c.get(f"/api/v1/jobs/{job}").json()
            assert (got["args"], got["result"], got["redacted"], got["state"]) == (None, None, True, "pending")
            assert c.get(f"/api/v1/dlq/{dead}").json()["args"] is None
            assert c.get(f"/api/v1/jobs/{job}/result").json()["redacted"] is True
    with make_client(settings, api_key=API_KEY) as c:
        got = c.get(f"/api/v1/jobs/{job}", headers={"X-API-Key": API_KEY}).json()
        assert (got["args"], got["redacted"]) == ({"email": "a@example.org"}, False)
        assert c.get(f"/api/v1/dlq/{dead}", headers={"X-API-Key": API_KEY}).json()["args"] == {"email": "b@example.org"}
    with make_client(settings, **SECURE, api_public_args=True) as c:
        assert c.get(f"/api/v1/jobs/{job}").json()["args"] == {"email": "a@example.org"}


def test_a_wrong_key_is_refused_on_every_route_logged_and_counted(
    settings: Settings, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    job = insert_job(conn)
    wrong = {"X-API-Key": "not-the-key"}
    with make_client(settings, api_key=API_KEY) as c, caplog.at_level(logging.WARNING, logger="postbox.app.api"):
        for method, path in (("GET", f"/api/v1/jobs/{job}"), ("GET", "/api/v1/queues"), ("POST", "/api/v1/jobs")):
            r = c.request(method, path, headers=wrong, json={"task": "api_echo"} if method == "POST" else None)
            assert r.status_code == 401, (path, r.text)
        assert c.post("/api/v1/queues/apiq/pause").status_code == 401
        assert _failures(c, "invalid") == 3.0
        assert _failures(c, "missing") == 1.0
    assert "not-the-key" not in caplog.text and API_KEY not in caplog.text
    assert len([r for r in caplog.records if r.getMessage() == "authentication failed"]) == 4


def test_with_key_for_all_the_stagedoor_routes_need_the_key_too(settings: Settings) -> None:
    keyed = settings.model_copy(update={"api_key": API_KEY, "api_key_for_all": True})
    with TestClient(create_demo_app(keyed), raise_server_exceptions=False) as c:
        event = {"name": "Gig", "capacity": 10}
        assert c.post("/api/v1/events", json=event).status_code == 401
        assert c.get("/api/v1/events/1").status_code == 401
        assert c.post("/api/v1/orders", json={"event_id": 1, "seats": 1, "email": "a@example.org"}).status_code == 401
        created = c.post("/api/v1/events", json=event, headers={"X-API-Key": API_KEY})
        assert created.status_code == 201, created.text


def test_key_for_all_without_a_key_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match=r"POSTBOX_API_KEY_FOR_ALL: .*needs POSTBOX_API_KEY"):
        load_settings(api_key_for_all=True)
    with pytest.raises(SettingsError, match="POSTBOX_API_KEY_FOR_ALL"):
        load_settings(api_key="  ", api_key_for_all=True)  # an empty key is no key
    assert load_settings(api_key="").api_key is None


def test_the_start_warnings_say_what_is_open() -> None:
    assert start_warnings(Settings(api_key=API_KEY, api_host="0.0.0.0")) == []
    insecure = start_warnings(Settings(api_insecure=True))
    assert len(insecure) == 1 and insecure[0].startswith("INSECURE MODE")
    exposed = start_warnings(Settings(api_host="0.0.0.0"))
    assert exposed[0].startswith("POSTBOX_API_KEY is not set") and "not a loopback address" in exposed[1]
    assert len(start_warnings(Settings(api_host="::1"))) == 1


def test_keys_are_compared_whole() -> None:
    assert key_matches(API_KEY, API_KEY)
    assert not key_matches(API_KEY + "x", API_KEY)
    assert not key_matches(API_KEY[:-1], API_KEY)
    assert not key_matches("\udcff", API_KEY)
    assert not key_matches(None, API_KEY)
