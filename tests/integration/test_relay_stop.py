"""A relay stops even when one of its loop tasks loses a cancel (postbox/cancellation.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.relay.notifier import Notifier
from postbox.settings import Settings
from tests.harness.relay import enqueue_sql, entry_ids, running_relay
from tests.harness.wait import next_item, wait_event


async def test_a_relay_stops_when_its_listener_lost_the_first_cancel(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg's connect on Python 3.11 can drop a cancel; the listener then LISTENs on. Stopping cancels again."""
    listen = Notifier.run
    lost: list[float] = []

    async def loses_the_first_cancel(self: Notifier) -> None:
        try:
            await listen(self)
        except asyncio.CancelledError:
            lost.append(time.monotonic())
            await asyncio.Event().wait()  # runs on, as a listener that never saw the cancel would

    monkeypatch.setattr(Notifier, "run", loses_the_first_cancel)
    async with running_relay(settings) as (_relay, signals):
        await wait_event(signals.listening, 10)
        ids = enqueue_sql(conn, 2)
        assert await next_item(signals.published, 10) == ids  # the listener works until the stop
    stopped = time.monotonic()  # running_relay waited at most 10 s for the relay's task to end
    assert len(lost) == 1 and stopped - lost[0] < 5
    assert await entry_ids(redis, settings.redis_prefix) == ids
