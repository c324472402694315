"""What the API, the dashboard and the events WebSocket show of job control (issue 32, items 4 and 6).

Real PostgreSQL and Redis, the API in-process. A progress note reaches only a reader allowed job
contents; an encrypted task's args are null without the API key, opened with it when the API holds the
encryption key, and the sealed envelope when it does not.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis as syncredis

import postbox
from postbox import encryption
from postbox.events import encode, event
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.api import API_KEY, make_client
from tests.harness.tasks import worker as t

K1 = "k1:" + base64.b64encode(b"1" * 32).decode()
K2 = "k2:" + base64.b64encode(b"2" * 32).decode()
CARD = "4111-2222-3333-4444"


@pytest.fixture
def keys() -> Iterator[None]:
    encryption.use_keys(K1)
    yield
    encryption.use_keys(None)


@pytest.mark.parametrize(
    ("overrides", "anonymous_sees_note"),
    [({"api_key": API_KEY}, False), ({"api_key": API_KEY, "api_public_args": True}, True), ({}, True)],
)
def test_the_events_websocket_sends_progress_with_its_note_only_to_a_reader_allowed_contents(
    settings: Settings, overrides: dict[str, Any], anonymous_sees_note: bool
) -> None:
    r = syncredis.Redis.from_url(str(settings.redis_url))
    progress = {"done": 3, "total": 10, "note": "row for alice@example.org", "attempt": 1, "at": "x"}
    try:
        with make_client(settings, **overrides) as client:
            with (
                client.websocket_connect("/ws/events?job_id=5") as anonymous,
                client.websocket_connect("/ws/events?job_id=5", headers={"X-API-Key": API_KEY}) as keyed,
            ):
                r.publish(events_channel(settings.redis_prefix), encode(event(
                    "progress", job_id=5, queue="q", task="t", attempt=1, progress=progress)))  # fmt: skip
                r.publish(events_channel(settings.redis_prefix), encode(event("succeeded", job_id=5, queue="q",
                                                                              task="t", attempt=1)))  # fmt: skip
                seen = [anonymous.receive_json(), anonymous.receive_json()]
                shown = [keyed.receive_json(), keyed.receive_json()]
    finally:
        r.close()
    assert [e["type"] for e in seen] == [e["type"] for e in shown] == ["progress", "succeeded"]
    assert shown[0]["progress"] == progress
    expected = progress if anonymous_sees_note else {**progress, "note": None}
    assert seen[0]["progress"] == expected
    assert seen[1] == {**shown[1]}  # other events unchanged


def test_an_api_without_the_key_refuses_to_enqueue_an_encrypted_task_clearly_and_writes_nothing(
    settings: Settings, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POSTBOX_ENCRYPTION_KEYS", raising=False)
    encryption.use_keys(None)
    with make_client(settings) as client:
        refused = client.post("/api/v1/jobs", json={"task": "w_secret", "args": {"card": CARD}})
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "ENCRYPTION_UNAVAILABLE"
    assert error["message"].startswith("no encryption key: set POSTBOX_ENCRYPTION_KEYS")
    assert CARD not in refused.text
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)


def test_an_encrypted_tasks_args_on_the_dashboard_and_in_the_dead_letters(
    settings: Settings, conn: psycopg.Connection[Any], keys: None
) -> None:
    with conn.transaction():
        job_id = postbox.enqueue(conn, t.w_secret, {"card": CARD, "n": 2})
    envelope = conn.execute("SELECT args FROM postbox.outbox").fetchone()[0]  # type: ignore[index]
    assert CARD not in str(envelope)
    with make_client(settings, api_key=API_KEY) as client:
        assert client.post("/ui/login", json={"key": API_KEY}).status_code == 204
        page = client.get(f"/api/v1/dashboard/jobs/{job_id}").json()
        assert page["args"] == {"card": CARD, "n": 2}
        conn.execute("UPDATE postbox.outbox SET state = 'dead', last_error = 'x' WHERE id = %s", (job_id,))
        conn.commit()
        dead = client.get(f"/api/v1/dlq/{job_id}", headers={"X-API-Key": API_KEY}).json()
        assert dead["args"] == {"card": CARD, "n": 2}
    with make_client(settings, api_key=API_KEY) as client:  # no session, no key
        anonymous = client.get(f"/api/v1/dlq/{job_id}").json()
        assert (anonymous["redacted"], anonymous["args"]) == (True, None)
        encryption.use_keys(K2)  # an API process without the key that sealed them: the envelope, never a guess
        assert client.get(f"/api/v1/dlq/{job_id}", headers={"X-API-Key": API_KEY}).json()["args"] == envelope
        encryption.use_keys(None)  # no key at all: the envelope too
        assert client.get(f"/api/v1/dlq/{job_id}", headers={"X-API-Key": API_KEY}).json()["args"] == envelope
    assert CARD not in str(conn.execute("SELECT args FROM postbox.outbox").fetchone())
