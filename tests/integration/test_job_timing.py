"""When a job finished: a ``ctx.transaction()`` job's success is stamped when it commits.

PostgreSQL's ``now()`` is the start of the transaction; the job's transaction
begins before its body runs, so a success stamped with it (migration 0006's
``record_success()``) made a 2 s job look like it took a few milliseconds
(issue 28). The outbox row, the attempt's history row and what the API shows
all carry the commit time.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import redis.asyncio as aioredis

from postbox.settings import Settings
from tests.harness.api import make_client
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch, finished, running_worker, worker_settings

WORK = 2.0


async def test_a_job_working_inside_ctx_transaction_finishes_when_its_transaction_commits(
    wsettings: Settings, settings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    job_id = await enqueue(aconn, t.w_slow_in_transaction, {"seconds": WORK})
    await publish_due(aconn, redis, wsettings.redis_prefix)
    # Worker sessions are cut off idle in a transaction after the visibility timeout: the
    # body's wait must stay under it.
    async with running_worker(worker_settings(wsettings, visibility_timeout=WORK * 5)) as worker:
        assert await finished(worker, 1, within=30) == [(job_id, "succeeded")]
    [(state, took, same)] = await fetch(
        aconn,
        "SELECT o.state, o.finished_at - o.started_at, o.finished_at = a.finished_at"
        " FROM postbox.outbox o JOIN postbox.job_attempts a ON a.outbox_id = o.id WHERE o.id = %s",
        (job_id,),
    )
    assert state == "succeeded"
    assert timedelta(seconds=WORK) <= took < timedelta(seconds=WORK + 5)
    assert same, "the outbox row and the history row carry one finish time"

    with make_client(settings) as client:
        job = client.get(f"/api/v1/jobs/{job_id}").json()
    [attempt] = job["history"]
    shown = datetime.fromisoformat(attempt["finished_at"]) - datetime.fromisoformat(attempt["started_at"])
    assert attempt["outcome"] == "succeeded"
    assert shown >= timedelta(seconds=WORK)  # the duration the dashboard's "took" column shows
    assert datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"]) >= timedelta(
        seconds=WORK
    )
