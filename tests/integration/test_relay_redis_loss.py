"""Redis loses data (FLUSHALL, restart without persistence, a lost entry): the relay republishes.

These tests use a private Redis server per test (tests/harness/redis_server.py):
never FLUSHALL the shared one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from postbox.streams import GROUP, epoch_key, stream_key
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401 - fixture
from tests.harness.relay import enqueue_sql, entries, running_relay
from tests.harness.wait import wait_event, wait_until_async

FINISHED = ("succeeded", "dead", "cancelled", "expired")


def set_outcomes(conn: psycopg.Connection[Any], ids: list[int]) -> dict[str, list[int]]:
    """Give 24 published jobs every kind of fate a worker could have recorded."""
    assert len(ids) == 24
    groups = {
        "succeeded": ids[0:4],
        "dead": ids[4:6],
        "cancelled": ids[6:8],
        "expired": ids[8:10],
        "running_stale": ids[10:13],
        "running_live": ids[13:16],
        "queued": ids[16:24],
    }
    for state in FINISHED:
        conn.execute(
            "UPDATE postbox.outbox SET state = %s, finished_at = now(), attempts = 1 WHERE id = ANY(%s)",
            (state, groups[state]),
        )
    conn.execute(
        """UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = 'worker-dead',
                             lease_until = now() - interval '1 second' WHERE id = ANY(%s)""",
        (groups["running_stale"],),
    )
    conn.execute(
        """UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = 'worker-live',
                             lease_until = now() + interval '1 hour' WHERE id = ANY(%s)""",
        (groups["running_live"],),
    )
    conn.commit()
    return groups


async def collect(queue: asyncio.Queue[list[int]] | None, want: set[int], within: float) -> list[int]:
    assert queue is not None
    got: list[int] = []
    async with asyncio.timeout(within):
        while not want <= set(got):
            got += await queue.get()
    return got


@pytest.fixture
def loss_settings(settings: Settings, private_redis: RedisServer) -> Settings:  # noqa: F811
    return settings.model_copy(update={"redis_url": private_redis.url})


async def published_ids(url: str, prefix: str) -> list[int]:
    client = aioredis.Redis.from_url(url)
    try:
        return sorted(int(e["id"]) for e in await entries(client, prefix))
    finally:
        await client.aclose()


@pytest.mark.parametrize("fault", ["flushall", "restart"])
async def test_after_redis_loses_everything_every_unfinished_job_is_republished_and_no_finished_one(
    fault: str,
    loss_settings: Settings,
    private_redis: RedisServer,  # noqa: F811
    conn: psycopg.Connection[Any],
) -> None:
    prefix = loss_settings.redis_prefix
    url = private_redis.url
    async with running_relay(loss_settings, sweep_interval=60.0) as (relay, signals):
        ids = enqueue_sql(conn, 24)
        await wait_until_async(lambda: relay.published_total == 24, 10, message="24 published")
        groups = set_outcomes(conn, ids)
        assert signals.redis_loss is not None
        signals.redis_loss.clear()  # the first start (empty Redis) counts as a loss too
        if fault == "flushall":
            private_redis.client().flushall()
        else:
            private_redis.restart()
        assert await published_ids(url, prefix) == []
        await wait_event(signals.redis_loss, 10)
        expected = set(groups["queued"] + groups["running_stale"])
        republished = await collect(signals.republished, expected, 10)
        fresh = enqueue_sql(conn, 2)  # publishing goes on as usual
        await wait_until_async(lambda: relay.published_total == 26, 10, message="new jobs published")
        client = aioredis.Redis.from_url(url)
        try:

            async def recovered() -> bool:
                value = await client.get(epoch_key(prefix))
                return value is not None and not value.startswith(b"recovering:")

            await wait_until_async(recovered, 5, message="recovery finished")
            epoch = await client.get(epoch_key(prefix))
            groups_found = await client.xinfo_groups(stream_key(prefix, "default", 5))
        finally:
            await client.aclose()
    assert sorted(republished) == sorted(expected)  # each once, and nothing else
    assert await published_ids(url, prefix) == sorted(expected | set(fresh))
    assert epoch is not None and not epoch.startswith(b"recovering:")
    assert [g["name"] for g in groups_found] == [GROUP.encode()]
    conn.commit()
    counts = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
    assert {i for i, c in counts.items() if c == 2} == expected
    assert relay.metrics.republished._value.get() == len(expected)


async def test_republishing_is_bounded_in_rate(
    settings: Settings,
    private_redis: RedisServer,  # noqa: F811
    conn: psycopg.Connection[Any],
) -> None:
    slow = settings.model_copy(update={"redis_url": private_redis.url, "republish_rate": 20, "relay_batch_size": 10})
    async with running_relay(slow, sweep_interval=60.0) as (relay, signals):
        ids = enqueue_sql(conn, 50)
        await wait_until_async(lambda: relay.published_total == 50, 10, message="50 published")
        assert signals.redis_loss is not None
        signals.redis_loss.clear()
        private_redis.client().flushall()
        await wait_event(signals.redis_loss, 10)
        start = time.monotonic()
        republished = await collect(signals.republished, set(ids), 15)
        elapsed = time.monotonic() - start
    assert sorted(republished) == ids
    # a burst of 10, then 20 rows/s: the other 40 take at least ~2 s
    assert elapsed >= 1.8


async def test_a_lost_entry_is_republished_by_the_sweep_but_never_a_finished_job(
    loss_settings: Settings,
    private_redis: RedisServer,  # noqa: F811
    conn: psycopg.Connection[Any],
) -> None:
    prefix = loss_settings.redis_prefix
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        async with running_relay(loss_settings, sweep_interval=0.2, sweep_min_age=0.3) as (relay, signals):
            ids = enqueue_sql(conn, 4)
            await wait_until_async(lambda: relay.published_total == 4, 10, message="4 published")
            lost, done, kept, stale = ids
            conn.execute("UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() WHERE id = %s", (done,))
            conn.execute(
                """UPDATE postbox.outbox SET state = 'running', claimed_by = 'w', attempts = 1,
                                     lease_until = now() - interval '1 s' WHERE id = %s""",
                (stale,),
            )
            conn.commit()
            sids = dict(conn.execute("SELECT id, stream_id FROM postbox.outbox").fetchall())
            key = stream_key(prefix, "default", 5)
            assert await client.xdel(key, sids[lost], sids[done], sids[stale]) == 3
            assert signals.republished is not None
            republished = await collect(signals.republished, {lost, stale}, 10)
            # three more sweeps find nothing more to republish
            reconciler = relay.reconciler
            assert reconciler is not None
            sweeps = reconciler.sweeps
            await wait_until_async(lambda: reconciler.sweeps >= sweeps + 3, 5, message="three more sweeps")
            assert relay.republished_total == 2
        found = sorted(int(e["id"]) for e in await entries(client, prefix))
    finally:
        await client.aclose()
    assert sorted(republished) == sorted([lost, stale])
    assert found == sorted([lost, kept, stale])
    conn.commit()
    assert conn.execute("SELECT publish_count FROM postbox.outbox WHERE id = %s", (done,)).fetchone() == (1,)
