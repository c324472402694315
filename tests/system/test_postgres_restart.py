"""PostgreSQL restarts (fast and immediate shutdown) under two relays and two busy workers.

The three-restart measurement runs with ``-m soak``; the promoted standby runs by
default (and so does tests/system/test_stagedoor_postgres_restart.py).

A private PostgreSQL server (system binaries, see tests/harness/postgres_server.py)
is restarted three times while a producer keeps enqueueing: ``pg_ctl -m fast``
(clients are told the server is shutting down), ``-m immediate`` (a crash: no
goodbye, recovery replays the WAL), and a crash with five seconds of outage
(longer than the relay's session timeout and the worker's heartbeat). Nobody
restarts the postbox processes: each must reconnect on its own, one relay must
lead again, and the usual invariants must hold — every committed job succeeded
exactly once, with one effect, attempts within max_attempts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from postbox import migrate
from tests.harness.ha import Processes, Producer, all_finished, check_invariants, finished_count, one
from tests.harness.postgres_server import PostgresServer, running_postgres, running_standby
from tests.harness.tasks import ha as tasks_ha
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


@pytest.fixture
def private_pg() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        url = server.url()
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(tasks_ha.EFFECTS_DDL)
        yield server


def leader_count(url: str) -> int:
    """Sessions holding an advisory lock: the relay leader's (leadership itself, not what a table says)."""
    return int(one(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"))


@pytest.mark.soak  # ~20 s; the Stagedoor restart test covers fast + immediate in the default run
@pytest.mark.timeout(240)
def test_postgres_fast_and_immediate_restarts_under_load(
    private_pg: PostgresServer, child_env: dict[str, str], tmp_path: Path
) -> None:
    url = private_pg.url()
    env = dict(
        child_env,
        POSTBOX_DATABASE_URL=url,
        POSTBOX_VISIBILITY_TIMEOUT="3",
        POSTBOX_HEARTBEAT_INTERVAL="0.5",
        POSTBOX_RELAY_SESSION_TIMEOUT="2",
        POSTBOX_DRAIN_TIMEOUT="2",
    )
    procs = Processes(env, tmp_path)
    producer = Producer(url)
    try:
        procs.relay()
        procs.relay()
        procs.worker()
        procs.worker()
        producer.start()
        wait_until(
            lambda: finished_count(url) >= 50, 60, message="the first 50 jobs done", ignore=(psycopg.OperationalError,)
        )
        for mode, down_for in (("fast", 0.0), ("immediate", 0.0), ("immediate", 5.0)):
            before = finished_count(url)
            restarted = time.monotonic()
            private_pg.restart(mode, down_for)
            up = time.monotonic()
            # Progress again: jobs enqueued after the restart are published, run and recorded.
            wait_until(
                lambda b=before: finished_count(url) >= b + 100,
                60,
                message=f"progress after the {mode} restart",
                ignore=(psycopg.OperationalError,),
            )
            print(f"\n{mode} restart: server down and up in {up - restarted:.2f}s; 100 more jobs done "
                  f"{time.monotonic() - up:.2f}s after it was up")  # fmt: skip
            wait_until(
                lambda: leader_count(url) == 1,
                30,
                message=f"one relay leading after the {mode} restart",
                ignore=(psycopg.OperationalError,),
            )
        producer.stop()
        assert producer.committed and producer.refused > 0  # the restarts were real: the producer saw them
        wait_until(lambda: all_finished(url), 90, message="every job finished", ignore=(psycopg.OperationalError,))
        assert procs.exit_codes() == [None] * 4  # nobody was restarted: each one reconnected on its own
        check_invariants(url, producer.committed)
        assert leader_count(url) == 1
    except BaseException:
        print(procs.tail())
        raise
    finally:
        producer.halt.set()
        procs.close()


def in_recovery(url: str) -> bool:
    return bool(one(url, "SELECT pg_is_in_recovery()"))


@pytest.mark.timeout(240)
def test_a_primary_crash_and_a_promoted_synchronous_standby_under_load(
    private_pg: PostgresServer, child_env: dict[str, str], tmp_path: Path
) -> None:
    """The processes know both servers (a libpq multi-host URL, read-write only): they follow the promotion."""
    primary = private_pg
    with running_standby(primary) as standby:
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            # Synchronous: a COMMIT returns once the standby has it, so the promotion loses no committed job.
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        wait_until(
            lambda: one(primary.url(), "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") == 1,
            30,
            message="the standby streaming synchronously",
            ignore=(psycopg.OperationalError,),
        )
        url = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
            "?target_session_attrs=read-write&connect_timeout=2"
        )
        env = dict(
            child_env,
            POSTBOX_DATABASE_URL=url,
            POSTBOX_VISIBILITY_TIMEOUT="3",
            POSTBOX_HEARTBEAT_INTERVAL="0.5",
            POSTBOX_RELAY_SESSION_TIMEOUT="2",
            POSTBOX_DRAIN_TIMEOUT="2",
        )
        procs = Processes(env, tmp_path)
        producer = Producer(url)
        try:
            procs.relay()
            procs.relay()
            procs.worker()
            procs.worker()
            producer.start()
            wait_until(
                lambda: finished_count(url) >= 50,
                60,
                message="the first 50 jobs done",
                ignore=(psycopg.OperationalError,),
            )
            before = finished_count(url)
            crashed = time.monotonic()
            primary.stop("immediate")
            standby.promote()
            promoted = time.monotonic()
            assert not in_recovery(standby.url())
            wait_until(
                lambda: finished_count(url) >= before + 100,
                60,
                message="progress on the promoted standby",
                ignore=(psycopg.OperationalError,),
            )
            print(f"\nfailover: crash to promoted in {promoted - crashed:.2f}s; 100 more jobs done "
                  f"{time.monotonic() - promoted:.2f}s after the promotion")  # fmt: skip
            wait_until(
                lambda: leader_count(url) == 1,
                30,
                message="one relay leading on the promoted standby",
                ignore=(psycopg.OperationalError,),
            )
            producer.stop()
            assert producer.committed and producer.refused > 0
            wait_until(lambda: all_finished(url), 90, message="every job finished", ignore=(psycopg.OperationalError,))
            assert procs.exit_codes() == [None] * 4
            check_invariants(url, producer.committed)
        except BaseException:
            print(procs.tail())
            raise
        finally:
            producer.halt.set()
            procs.close()
