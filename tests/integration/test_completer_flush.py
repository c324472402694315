"""When the completer writes: at once after a quiet spell, batched when outcomes follow each other closely."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import redis.asyncio as aioredis

from postbox.outcomes import Outcome
from postbox.settings import Settings
from postbox.worker.completer import Finished
from postbox.worker.delivery import Delivery, Job
from tests.harness.tasks import hardening as h
from tests.harness.worker import completer_of_worker_test, fetch, running_jobs, small_pool

INTERVAL = 3.0  # long enough that "at once" and "after the interval" cannot be confused on a busy machine


async def test_an_outcome_after_a_quiet_spell_is_written_at_once_and_close_ones_are_batched(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    ids = await running_jobs(aconn, h.h_sync_pid, 3)
    stream = f"{wsettings.redis_prefix}:{{wtest}}:p5"
    done: asyncio.Queue[tuple[float, list[Finished]]] = asyncio.Queue()
    async with small_pool(wsettings) as pool:
        completer = completer_of_worker_test(
            pool, redis, wsettings, lambda batch: done.put_nowait((time.monotonic(), batch)), flush_interval=INTERVAL
        )

        def add(n: int) -> None:
            delivery = Delivery(stream, b"%d-0" % (n + 1), ids[n], "h_sync_pid", "{}", "{}", "wtest", 5, 0)
            completer.add(Finished(delivery, Job(delivery, 1, 5, None, True, 0), Outcome("succeeded", "succeeded")))

        runner = asyncio.create_task(completer.run())
        try:
            added = time.monotonic()
            add(0)  # nothing was flushed before: written at once, not after the interval
            written, first = await asyncio.wait_for(done.get(), 30)
            assert [f.delivery.job_id for f in first] == [ids[0]]
            assert written - added < INTERVAL / 2
            add(1)  # right after a flush began: waits the interval for company
            add(2)
            written, second = await asyncio.wait_for(done.get(), 30)
            assert sorted(f.delivery.job_id for f in second) == ids[1:]
            assert done.empty()
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
    assert await fetch(aconn, "SELECT state FROM postbox.outbox ORDER BY id") == [("succeeded",)] * 3
