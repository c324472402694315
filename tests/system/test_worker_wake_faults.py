"""A worker over eleven queues (110 streams) waits on the wake-up stream: relay SIGKILL, Redis restarted empty.

Over more than 100 streams a worker blocks on ``<prefix>:wake`` and the read
behind that wait reads the streams its entries name (docs/worker.md,
"Reading"). The entries are a hint for the wait's latency, never what
delivery rests on. Real relay and worker processes on a private Redis: jobs
committed one at a time while the worker waits start within seconds across
queues and priorities (the idle worker blocked on one key, not on two groups
of streams); the leading relay SIGKILLed and Redis restarted empty while the
worker is blocked on the wake-up stream lose no job and run none twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

import postbox
from tests.harness.fleet import Fleet, one, worker_id_of
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401 - fixture
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

QUEUES = [t.QUEUE, *(f"wk{i:02d}" for i in range(10))]  # 11 queues x 10 priorities: 110 streams


def state(db: psycopg.Connection[Any], job_id: int) -> str | None:
    return one(db, "SELECT state FROM postbox.outbox WHERE id = %s", (job_id,))  # type: ignore[no-any-return]


def blocked_on_one_key(redis: RedisServer) -> bool:
    with redis.client() as client:
        return int(client.info("clients")["blocked_clients"]) == 1


def test_a_worker_over_many_streams_loses_nothing_through_a_relay_kill_and_a_redis_restart(
    child_env: dict[str, str],
    db: psycopg.Connection[Any],
    private_redis: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = dict(child_env, POSTBOX_REDIS_URL=private_redis.url)
    with Fleet(env, tmp_path, queue=",".join(QUEUES), concurrency=4) as fleet:
        relay = fleet.relay()
        worker = fleet.worker()
        wait_until(lambda: worker_id_of(db, worker), 30, message=lambda: f"worker up\n{fleet.logs()}")
        wait_until(lambda: blocked_on_one_key(private_redis), 20, message=lambda: f"idle\n{fleet.logs()}")

        jobs: list[int] = []

        def run_one(n: int, within: float) -> None:
            queue, priority = QUEUES[(3 * n) % len(QUEUES)], n % 10
            job_id = postbox.enqueue(
                db, t.w_slow_effect, {"seconds": 0.0, "label": f"j{n}"}, queue=queue, priority=priority
            )
            jobs.append(job_id)
            wait_until(
                lambda: state(db, job_id) == "succeeded",
                within,
                message=lambda: f"job {n} on {queue} p{priority}: {state(db, job_id)}\n{fleet.logs()}",
            )

        for n in range(12):  # one at a time: the worker waits before each
            run_one(n, 10)

        relay.kill()
        relay.wait(10)
        orphans = [
            postbox.enqueue(db, t.w_slow_effect, {"seconds": 0.0, "label": f"o{n}"}, queue=QUEUES[n], priority=n)
            for n in range(5)
        ]
        jobs += orphans
        fleet.relay()  # takes the lock and publishes what the dead one left
        wait_until(
            lambda: all(state(db, job_id) == "succeeded" for job_id in orphans),
            30,
            message=lambda: f"after the relay's kill\n{fleet.logs()}",
        )

        wait_until(lambda: blocked_on_one_key(private_redis), 20, message=lambda: f"idle again\n{fleet.logs()}")
        private_redis.restart()  # empty: the wake-up stream, the streams and their groups are gone
        for n in range(12, 20):
            run_one(n, 30)

    effects = db.execute("SELECT job_id, count(*) FROM worker_effects GROUP BY job_id").fetchall()
    assert dict(effects) == dict.fromkeys(jobs, 1)
    states = db.execute("SELECT state, count(*) FROM postbox.outbox GROUP BY state").fetchall()
    assert states == [("succeeded", len(jobs))]
    log = fleet.logs()
    assert "entries came with no wake-up entry" not in log  # every relay of this version writes them
