"""The enqueue's ``enqueued`` event goes out only while someone subscribes, and reaches whoever does.

Without a subscriber the one-statement enqueue runs alone in autocommit: no
BEGIN, no COMMIT, no PUBLISH. A WebSocket client of the API is seen at once; a
subscriber of its own on Redis once the API's audience has counted it (within
a second; the tests make the count fresh for every request).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import redis as syncredis
from fastapi.testclient import TestClient

from postbox.events import decode
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.api import make_client

DEADLINE = 15.0


def _next_message(pubsub: Any) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if message is not None and message["type"] in ("message", "pmessage"):
            return decode(message["data"])
    raise AssertionError("no event within the deadline")


def _wait_subscribed(pubsub: Any) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message is not None and message["type"] in ("subscribe", "psubscribe"):
            return
    raise AssertionError("not subscribed within the deadline")


def _count_every_time(client: TestClient) -> None:
    """The API's audience asks Redis at every request (instead of once a second)."""
    audience = client.app.state.postbox.events.audience  # type: ignore[attr-defined]
    audience.interval = 0.0


def test_a_websocket_client_gets_the_enqueued_event(settings: Settings) -> None:
    with make_client(settings) as client, client.websocket_connect("/ws/events?queue=apiq") as ws:
        created = client.post("/api/v1/jobs", json={"task": "api_echo"})
        assert created.status_code == 201
        evt = ws.receive_json()
        assert (evt["type"], evt["job_id"], evt["queue"], evt["task"]) == (
            "enqueued",
            created.json()["id"],
            "apiq",
            "api_echo",
        )


def test_only_events_of_enqueues_made_while_someone_subscribes_are_sent(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    """A pattern subscriber (not counted by PUBSUB NUMSUB) sees every PUBLISH: the first it gets is the second job's."""
    r = syncredis.Redis.from_url(str(settings.redis_url))
    channel = events_channel(settings.redis_prefix)
    watcher, listener = r.pubsub(), r.pubsub()
    try:
        watcher.psubscribe(channel)
        _wait_subscribed(watcher)
        with make_client(settings) as client:
            _count_every_time(client)
            unheard = client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": 1}})
            assert unheard.status_code == 201
            row = conn.execute(
                "SELECT task, queue, args, state FROM postbox.outbox WHERE id = %s", (unheard.json()["id"],)
            ).fetchone()
            conn.commit()
            assert row == ("api_sum", "apiq", {"a": 1}, "pending")  # committed without an event
            listener.subscribe(channel)
            _wait_subscribed(listener)
            heard = client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": 2}})
            assert heard.status_code == 201
            for pubsub in (listener, watcher):
                evt = _next_message(pubsub)
                assert (evt["type"], evt["job_id"]) == ("enqueued", heard.json()["id"])
    finally:
        watcher.close()
        listener.close()
        r.close()


def test_a_subscriber_gets_the_event_of_a_deduplicated_enqueue(settings: Settings) -> None:
    """The general path (a dedup key: a lookup first) sends its event inside the transaction, as before."""
    r = syncredis.Redis.from_url(str(settings.redis_url))
    listener = r.pubsub()
    try:
        listener.subscribe(events_channel(settings.redis_prefix))
        _wait_subscribed(listener)
        with make_client(settings) as client:
            _count_every_time(client)
            created = client.post("/api/v1/jobs", json={"task": "api_echo", "dedup_key": "once"})
            again = client.post("/api/v1/jobs", json={"task": "api_echo", "dedup_key": "once"})
            assert (created.status_code, again.status_code) == (201, 200)
            evt = _next_message(listener)
            assert (evt["type"], evt["job_id"]) == ("enqueued", created.json()["id"])
    finally:
        listener.close()
        r.close()


def test_connections_go_back_to_the_pool_in_transactions(settings: Settings) -> None:
    """After autocommit enqueues, every pooled connection is out of autocommit: other routes' writes stay atomic."""
    with make_client(settings) as client:
        for n in range(5):
            assert client.post("/api/v1/jobs", json={"task": "api_sum", "args": {"a": n}}).status_code == 201
        pool = client.app.state.postbox.pool  # type: ignore[attr-defined]

        async def modes() -> list[bool]:
            held = [await pool.getconn() for _ in range(pool.get_stats()["pool_size"])]
            try:
                return [c.autocommit for c in held]
            finally:
                for c in held:
                    await pool.putconn(c)

        assert client.portal is not None
        found = client.portal.call(modes)
        assert found and not any(found)
