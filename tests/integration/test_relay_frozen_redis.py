"""A Redis that stops answering (SIGSTOP) past the relay's socket timeout: the relay waits it out and goes on."""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg
import pytest

from postbox.settings import Settings
from tests.harness.redis_server import RedisServer
from tests.harness.relay import enqueue_sql, running_relay
from tests.harness.wait import wait_until_async


async def test_the_relay_outlives_a_redis_that_stops_answering(
    settings: Settings,
    conn: psycopg.Connection[Any],
    private_redis: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No reply within the 5 s socket timeout is Redis unavailable, as a refused connection is: the relay
    (its publishing and its look at the streams beside it) does not end with Python's TimeoutError."""
    on_private = settings.model_copy(update={"redis_url": private_redis.url})
    options = {"epoch_check_interval": 0.05, "sweep_interval": 3600, "sweep_min_age": 3600}
    assert private_redis.proc is not None
    pid = private_redis.proc.pid
    async with running_relay(on_private, **options) as (relay, _signals):
        enqueue_sql(conn, 2)
        await wait_until_async(lambda: relay.published_total == 2, 10, message="2 published")
        os.kill(pid, signal.SIGSTOP)
        try:
            enqueue_sql(conn, 1)
            await wait_until_async(
                lambda: any(r.getMessage() == "Redis unavailable" for r in caplog.records),
                30,
                message="the relay found Redis unavailable",
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_until_async(lambda: relay.published_total == 3, 30, message="the third job published")
        assert relay.is_leader  # (the relay's task ending with the error would fail the test as it leaves)
