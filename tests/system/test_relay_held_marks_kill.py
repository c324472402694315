"""A relay SIGKILLed while it holds marks back (``POSTBOX_RELAY_MARK_DELAY``): the job is sent again, runs once."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

import postbox
from postbox.settings import Settings
from tests.harness.fleet import Fleet, one
from tests.harness.relay import entries
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


def entry_ids(settings: Settings) -> list[int]:
    async def look() -> list[int]:
        client = aioredis.Redis.from_url(str(settings.redis_url))
        try:
            return [int(e["id"]) for e in await entries(client, settings.redis_prefix, t.QUEUE)]
        finally:
            await client.aclose()

    return asyncio.run(look())


def test_a_relay_killed_holding_a_mark_leaves_the_job_to_the_next_leader_and_it_runs_once(
    fleet: Fleet, db: psycopg.Connection[Any], settings: Settings
) -> None:
    first = fleet.start("-m", "postbox.relay", "run", name="relay", POSTBOX_RELAY_MARK_DELAY="1")
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.relays WHERE role = 'leader'") == 1,
        30,
        message=lambda: f"a leader\n{fleet.logs()}",
    )
    job = postbox.enqueue(db, t.w_count)
    wait_until(lambda: entry_ids(settings) == [job], 15, message=lambda: f"the job sent\n{fleet.logs()}")
    first.kill()  # within the second it holds the mark back
    first.wait(10)
    row = "SELECT state, published_at IS NULL, publish_count FROM postbox.outbox WHERE id = %s"
    assert db.execute(row, (job,)).fetchone() == ("pending", True, 0)  # sent, never marked
    fleet.relay()
    wait_until(lambda: entry_ids(settings) == [job, job], 30, message=lambda: f"sent again\n{fleet.logs()}")
    wait_until(
        lambda: db.execute(row, (job,)).fetchone() == ("queued", False, 1),
        30,
        message=lambda: f"marked by the new leader\n{fleet.logs()}",
    )
    fleet.worker()
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox WHERE id = %s", (job,)) == "succeeded",
        30,
        message=lambda: f"ran\n{fleet.logs()}",
    )
    # both entries are gone once the run's outcome is in and the second delivery was turned away
    wait_until(lambda: entry_ids(settings) == [], 30, message=lambda: f"entries left\n{fleet.logs()}")
    assert one(db, "SELECT value FROM worker_counter WHERE name = 'hits'") == 1
    assert db.execute("SELECT attempt, outcome FROM postbox.job_attempts WHERE outbox_id = %s", (job,)).fetchall() == [
        (1, "succeeded")
    ]
