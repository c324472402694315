"""A real relay process while its (private) Redis restarts empty: unfinished jobs come back, finished ones do not."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from postbox.streams import epoch_key
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401 - fixture
from tests.harness.relay import enqueue_sql, entries, relay_processes
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


def stream_ids(url: str, prefix: str) -> list[int]:
    async def read() -> list[int]:
        client = aioredis.Redis.from_url(url)
        try:
            return sorted(int(e["id"]) for e in await entries(client, prefix))
        finally:
            await client.aclose()

    return asyncio.run(read())


def marked(conn: psycopg.Connection[Any], ids: list[int]) -> bool:
    conn.commit()
    row = conn.execute(
        "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND published_at IS NOT NULL", (ids,)
    ).fetchone()
    conn.commit()
    return row is not None and row[0] == len(ids)


def test_redis_restart_without_persistence_under_a_relay_process(
    child_env: dict[str, str],
    conn: psycopg.Connection[Any],
    settings: Settings,
    private_redis: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    prefix = settings.redis_prefix
    env = dict(child_env, POSTBOX_REDIS_URL=private_redis.url)
    with relay_processes(env, 1, tmp_path) as procs:
        ids = enqueue_sql(conn, 10)
        wait_until(lambda: stream_ids(private_redis.url, prefix) == ids, 15, message="10 published")
        wait_until(lambda: marked(conn, ids), 5, message="10 marked")
        finished, running, queued = ids[:3], ids[3:5], ids[5:]
        conn.execute(
            "UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() WHERE id = ANY(%s)", (finished,)
        )
        conn.execute(
            """UPDATE postbox.outbox SET state = 'running', attempts = 1, claimed_by = 'gone',
                                 lease_until = now() - interval '1 s' WHERE id = ANY(%s)""",
            (running,),
        )
        conn.commit()
        private_redis.restart()  # the new server starts empty; the relay may refill it any moment now
        seen: list[list[int]] = []

        def republished() -> bool:
            seen.append(stream_ids(private_redis.url, prefix))
            return seen[-1] == sorted(running + queued)

        try:
            wait_until(republished, 15, message="republished")
        except AssertionError:
            log = (tmp_path / "relay-0.log").read_text()
            raise AssertionError(
                f"stream holds {seen[-1]}, want {sorted(running + queued)}; relay log:\n{log}"
            ) from None
        fresh = enqueue_sql(conn, 2)
        wait_until(
            lambda: stream_ids(private_redis.url, prefix) == sorted(running + queued + fresh), 10, message="new jobs"
        )
        wait_until(lambda: marked(conn, fresh), 5, message="new jobs marked")
        assert procs[0].poll() is None
    assert private_redis.client().get(epoch_key(prefix)) is not None
    conn.commit()
    counts = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
    assert counts == {**{i: 1 for i in finished + fresh}, **{i: 2 for i in running + queued}}
    log = (tmp_path / "relay-0.log").read_text()
    assert "Redis lost data" in log
