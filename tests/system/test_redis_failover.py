"""A Redis failover that loses the last writes, under a relay and two busy workers.

A primary and its replica (tests/harness/redis_failover.py). While a producer
keeps enqueueing, replication stops (the replica's data freezes), the primary
goes on for a while — new stream entries, XACKs and XDELs of finished jobs,
deliveries recorded in the consumer group — then it is killed and the replica's
data is served on its address. The epoch key and every stream survive; only
their tail is gone. The relay must notice (the high-water check, about a
second) and republish; the lost XACKs come back as redeliveries that the
workers skip; the jobs published during the last moments (the workers are
paused then) have no entry any more. Invariants: every committed job succeeded, one effect each.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis as syncredis

from postbox.relay.watermark import parse_entry_id
from postbox.streams import stream_key
from tests.harness.ha import Processes, Producer, all_finished, check_invariants, finished_count, one
from tests.harness.redis_failover import RedisPair, redis_pair
from tests.harness.tasks import ha as tasks_ha
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[RedisPair]:
    with redis_pair(tmp_path / "redis") as found:
        yield found


def last_generated(client: syncredis.Redis, key: str) -> tuple[int, int]:
    info = client.xinfo_stream(key)
    return parse_entry_id(info["last-generated-id"])


def queued_published(url: str) -> int:
    return int(one(url, "SELECT count(*) FROM postbox.outbox WHERE state = 'queued' AND stream_id IS NOT NULL"))


def unfinished_among(url: str, ids: list[int]) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(
            "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND state <> 'succeeded'", (ids,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def leading_relay(url: str, procs: Processes) -> subprocess.Popen[bytes] | None:
    by_pid = {proc.pid: proc for proc in procs.procs[:2] if proc.poll() is None}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM postbox.relays WHERE role = 'leader'").fetchall()
    found = [by_pid[pid] for (pid,) in rows if pid in by_pid]
    return found[0] if len(found) == 1 else None


@pytest.mark.timeout(240)
@pytest.mark.parametrize("leader_dies", [False, True], ids=["same-leader", "leader-dies-too"])
def test_a_failover_to_a_replica_missing_the_last_writes_loses_nothing_and_runs_nothing_twice(
    leader_dies: bool, pair: RedisPair, database_url: str, child_env: dict[str, str], tmp_path: Path
) -> None:
    """``leader-dies-too``: the leading relay is SIGKILLed with the Redis primary. Its successor
    starts its high-water marks from the stream ids PostgreSQL recorded, and finds the lost tail too."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(tasks_ha.EFFECTS_DDL)
    env = dict(
        child_env,
        POSTBOX_REDIS_URL=pair.url,
        POSTBOX_VISIBILITY_TIMEOUT="3",
        POSTBOX_HEARTBEAT_INTERVAL="0.5",
        POSTBOX_RELAY_SESSION_TIMEOUT="2",
        POSTBOX_DRAIN_TIMEOUT="2",
    )
    key = stream_key(env["POSTBOX_REDIS_PREFIX"], tasks_ha.QUEUE, 5)
    procs = Processes(env, tmp_path)
    producer = Producer(database_url)
    try:
        procs.relay()
        procs.relay()
        procs.worker()
        procs.worker()
        producer.start()
        wait_until(
            lambda: finished_count(database_url) >= 50,
            60,
            message="the first 50 jobs done",
            ignore=(psycopg.OperationalError,),
        )
        pair.wait_synced()
        pair.detach_replica()
        with pair.replica.client() as replica:
            kept = last_generated(replica, key)
        done_at_detach = finished_count(database_url)
        # The tail the replica never gets: entries published, and jobs finished (XACK + XDEL).
        wait_until(
            lambda: finished_count(database_url) >= done_at_detach + 50,
            60,
            message="50 jobs done after the detach",
            ignore=(psycopg.OperationalError,),
        )
        # And jobs published but not yet taken: the workers pause while the relay goes on.
        workers = procs.procs[2:]
        for worker in workers:
            worker.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until(
            lambda: queued_published(database_url) >= 20,
            30,
            message="20 jobs published to no one",
            ignore=(psycopg.OperationalError,),
        )
        waiting = time.monotonic() - stopped
        with pair.primary.client() as primary, pair.replica.client() as replica:
            assert last_generated(primary, key) > kept  # the replica misses entries...
            assert replica.get(f"{env['POSTBOX_REDIS_PREFIX']}:epoch") is not None  # ...but has the epoch key
        committed = list(producer.committed)
        if leader_dies:
            leader = leading_relay(database_url, procs)
            assert leader is not None
            leader.kill()
        outage = pair.fail_over()
        for worker in workers:
            worker.send_signal(signal.SIGCONT)
        failed_over = time.monotonic()
        wait_until(
            lambda: unfinished_among(database_url, committed) == 0,
            60,
            message="the jobs before the failover",
            ignore=(psycopg.OperationalError,),
        )
        repaired = time.monotonic() - failed_over
        case = "leader killed too" if leader_dies else "same leader"
        print(f"\nfailover ({case}): workers paused {waiting:.2f}s, {outage:.2f}s without Redis; "
              f"every job committed before it done {repaired:.2f}s later")  # fmt: skip
        producer.stop()
        wait_until(
            lambda: all_finished(database_url), 90, message="every job finished", ignore=(psycopg.OperationalError,)
        )
        assert sorted(procs.exit_codes(), key=str) == ([-9] if leader_dies else []) + [None] * (3 if leader_dies else 4)
        check_invariants(database_url, producer.committed)
        assert "Redis lost the newest entries of streams" in procs.text("relay")
        assert int(one(database_url, "SELECT count(*) FROM postbox.outbox")) >= len(committed)
    except BaseException:
        print(procs.tail())
        raise
    finally:
        producer.halt.set()
        procs.close()
