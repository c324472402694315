"""What an operator counts of job control (issue 32): a snooze is its own outcome in the worker's
``postbox_worker_jobs`` (not a retry), so a dashboard can tell "not yet" from failures."""

from __future__ import annotations

from typing import Any

import psycopg
import redis.asyncio as aioredis

from postbox.settings import Settings
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch, finished, running_worker


async def test_a_snooze_is_counted_as_snoozed_not_as_a_retry(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    aconn = effects
    snoozing = await enqueue(aconn, t.w_snooze, {"times": 1, "seconds": 60.0})
    failing = await enqueue(aconn, t.w_retry_later, {"seconds": 60.0})
    await publish_due(aconn, redis, wsettings.redis_prefix)
    async with running_worker(wsettings) as worker:
        assert sorted(await finished(worker, 2)) == sorted([(snoozing, "snoozed"), (failing, "retry")])
        registry = worker.metrics.registry

        def count(task: str, outcome: str) -> float | None:
            labels = {"queue": t.QUEUE, "task": task, "outcome": outcome}
            return registry.get_sample_value("postbox_worker_jobs_total", labels)

        assert (count("w_snooze", "started"), count("w_snooze", "snoozed"), count("w_snooze", "retried")) == (
            1,
            1,
            None,
        )
        assert (count("w_retry_later", "retried"), count("w_retry_later", "snoozed")) == (1, None)
    assert await fetch(aconn, "SELECT outcome FROM postbox.job_attempts ORDER BY outbox_id") == [
        ("snoozed",),
        ("retry",),
    ]
