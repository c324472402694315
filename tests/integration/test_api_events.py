"""WS /ws/events in-process: filters, order, and the key guard (events injected on the Redis channel)."""

from __future__ import annotations

import pytest
import redis as syncredis
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from postbox.events import encode, event
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.api import API_KEY, client_fixture, make_client  # noqa: F401


def test_job_filter_delivers_only_that_jobs_events_in_order(client: TestClient, settings: Settings) -> None:
    r = syncredis.Redis.from_url(str(settings.redis_url))
    channel = events_channel(settings.redis_prefix)
    try:
        with client.websocket_connect("/ws/events?job_id=7") as ws:
            sequence = ["enqueued", "published", "started", "retrying", "published", "started", "succeeded"]
            for n, type_ in enumerate(sequence):
                r.publish(channel, encode(event(type_, job_id=8, queue="q", task="t")))  # another job
                r.publish(channel, encode(event(type_, job_id=7, queue="q", task="t", attempt=n)))  # type: ignore[arg-type]
            r.publish(channel, b"not an event")
            got = [ws.receive_json() for _ in sequence]
        assert [e["type"] for e in got] == sequence
        assert [e["attempt"] for e in got] == list(range(len(sequence)))
        assert {e["job_id"] for e in got} == {7}
    finally:
        r.close()


def test_key_for_all_guards_the_websocket(settings: Settings) -> None:
    with make_client(settings, api_key=API_KEY, api_key_for_all=True) as c:
        with pytest.raises(WebSocketDisconnect) as info, c.websocket_connect("/ws/events") as ws:
            ws.receive_json()
        assert info.value.code == 1008
        with c.websocket_connect("/ws/events", headers={"X-API-Key": API_KEY}):
            pass
