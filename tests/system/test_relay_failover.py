"""Real relay processes (``python -m postbox.relay run``) and real signals: one leader, failover, shutdown."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.settings import Settings
from tests.harness.relay import enqueue_sql, entries, leader_pid, relay_processes
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.system, pytest.mark.alone]  # failover and exit times


def roles(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, int]]:
    conn.commit()
    found = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, role, term FROM postbox.relays").fetchall()}
    conn.commit()
    return found


def current_leader(conn: psycopg.Connection[Any]) -> str | None:
    """The relay whose lock session holds the lock now (its registry row says leader, highest term)."""
    conn.commit()
    row = conn.execute("SELECT id FROM postbox.relays WHERE role = 'leader' ORDER BY term DESC LIMIT 1").fetchone()
    conn.commit()
    return str(row[0]) if row else None


def unpublished(conn: psycopg.Connection[Any], ids: list[int]) -> list[int]:
    conn.commit()
    rows = conn.execute(
        "SELECT id FROM postbox.outbox WHERE id = ANY(%s) AND published_at IS NULL ORDER BY id", (ids,)
    ).fetchall()
    conn.commit()
    return [r[0] for r in rows]


def publish_counts(conn: psycopg.Connection[Any]) -> dict[int, int]:
    conn.commit()
    found = dict(conn.execute("SELECT id, publish_count FROM postbox.outbox").fetchall())
    conn.commit()
    return found


def log_text(tmp_path: Path, index: int) -> str:
    return (tmp_path / f"relay-{index}.log").read_text()


def start_pair(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Wait until both relays registered and one leads; return (leader index, standby index)."""
    wait_until(lambda: len(roles(conn)) == 2 and current_leader(conn) is not None, 15, message="two relays, one leader")
    leader = current_leader(conn)
    wait_until(
        lambda: sorted(role for role, _ in roles(conn).values()) == ["leader", "standby"], 5, message="a standby"
    )
    return (0, 1) if leader == "relay-t0" else (1, 0)


async def stream_id_counts(settings: Settings) -> Counter[int]:
    client = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        return Counter(int(e["id"]) for e in await entries(client, settings.redis_prefix))
    finally:
        await client.aclose()


def test_two_relays_exactly_one_publishes_and_every_row_once(
    child_env: dict[str, str], conn: psycopg.Connection[Any], settings: Settings, tmp_path: Path
) -> None:
    with relay_processes(child_env, 2, tmp_path) as procs:
        leader, standby = start_pair(conn)
        ids: list[int] = []
        for _ in range(20):
            ids += enqueue_sql(conn, 10)
        wait_until(lambda: not unpublished(conn, ids), 10, message="every row published")
        assert all(p.poll() is None for p in procs)
        assert roles(conn)[f"relay-t{standby}"][0] == "standby"
    assert publish_counts(conn) == {i: 1 for i in ids}
    assert asyncio.run(stream_id_counts(settings)) == Counter({i: 1 for i in ids})
    assert ": leader " in log_text(tmp_path, leader)
    assert ": leader " not in log_text(tmp_path, standby)


def test_sigkill_the_leader_and_the_standby_publishes_new_rows_within_5_s(
    child_env: dict[str, str], conn: psycopg.Connection[Any], settings: Settings, tmp_path: Path
) -> None:
    with relay_processes(child_env, 2, tmp_path) as procs:
        leader, standby = start_pair(conn)
        before = enqueue_sql(conn, 5)
        wait_until(lambda: not unpublished(conn, before), 10, message="first rows published")
        procs[leader].kill()
        killed_at = time.monotonic()
        procs[leader].wait(timeout=5)
        after = enqueue_sql(conn, 5)
        wait_until(lambda: not unpublished(conn, after), 5, message="standby publishes")
        took = time.monotonic() - killed_at
        assert current_leader(conn) == f"relay-t{standby}"
    assert took < 5.0
    assert publish_counts(conn) == {i: 1 for i in before + after}
    assert asyncio.run(stream_id_counts(settings)) == Counter({i: 1 for i in before + after})


def test_terminating_the_leaders_session_moves_leadership(
    child_env: dict[str, str], conn: psycopg.Connection[Any], settings: Settings, tmp_path: Path
) -> None:
    with relay_processes(child_env, 2, tmp_path) as procs:
        leader, standby = start_pair(conn)
        before = enqueue_sql(conn, 5)
        wait_until(lambda: not unpublished(conn, before), 10, message="first rows published")
        old_pid = leader_pid(conn, settings.relay_lock_key)
        assert old_pid is not None
        conn.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        conn.commit()
        terminated_at = time.monotonic()
        after = enqueue_sql(conn, 5)
        wait_until(lambda: not unpublished(conn, after), 5, message="rows published after the takeover")
        took = time.monotonic() - terminated_at
        wait_until(lambda: current_leader(conn) == f"relay-t{standby}", 5, message="the standby leads")
        # the old leader noticed, and stands by on a new session
        wait_until(lambda: "lost leadership" in log_text(tmp_path, leader), 5, message="lost leadership logged")
        wait_until(lambda: roles(conn)[f"relay-t{leader}"][0] == "standby", 5, message="old leader stands by")
        # a standby logs what it waits on (docs/operations.md), after the lost leadership
        wait_until(
            lambda: ": standby: waiting for " in log_text(tmp_path, leader).partition("lost leadership")[2],
            5,
            message="the old leader logs what it waits on",
        )
        new_pid = leader_pid(conn, settings.relay_lock_key)
        assert new_pid not in (None, old_pid)
        assert all(p.poll() is None for p in procs)
    assert took < 5.0
    old_log = log_text(tmp_path, leader)
    assert old_log.index("lost leadership") < old_log.rindex(": standby: waiting for the leader lock ")
    assert publish_counts(conn) == {i: 1 for i in before + after}
    assert asyncio.run(stream_id_counts(settings)) == Counter({i: 1 for i in before + after})


def test_sigstop_the_leader_past_failover_then_sigcont_loses_nothing(
    child_env: dict[str, str], conn: psycopg.Connection[Any], settings: Settings, tmp_path: Path
) -> None:
    env = dict(child_env, POSTBOX_RELAY_SESSION_TIMEOUT="1", POSTBOX_RELAY_BATCH_SIZE="50")
    with relay_processes(env, 2, tmp_path) as procs:
        leader, standby = start_pair(conn)
        conn.execute("SELECT postbox.enqueue('noop', '{}'::jsonb) FROM generate_series(1, 2000)")
        conn.commit()
        procs[leader].send_signal(signal.SIGSTOP)  # most likely in the middle of the burst
        stopped_at = time.monotonic()
        conn.commit()
        burst = [r[0] for r in conn.execute("SELECT id FROM postbox.outbox ORDER BY id").fetchall()]
        conn.commit()
        during = enqueue_sql(conn, 10)
        wait_until(lambda: not unpublished(conn, burst + during), 10, message="standby publishes everything")
        failover = time.monotonic() - stopped_at
        assert current_leader(conn) == f"relay-t{standby}"
        procs[leader].send_signal(signal.SIGCONT)
        wait_until(lambda: "lost leadership" in log_text(tmp_path, leader), 5, message="resumed leader steps down")
        wait_until(lambda: roles(conn)[f"relay-t{leader}"][0] == "standby", 5, message="it stands by")
        after = enqueue_sql(conn, 10)
        wait_until(lambda: not unpublished(conn, after), 5, message="rows after the resume")
        assert all(p.poll() is None for p in procs)
    every = burst + during + after
    assert failover < 5.0
    # nothing lost: every row marked exactly once (a stale leader cannot mark) ...
    assert publish_counts(conn) == {i: 1 for i in every}
    # ... and in the stream at least once; a duplicate entry carries the same outbox id
    counts = asyncio.run(stream_id_counts(settings))
    assert set(counts) == set(every)


def test_sigterm_exits_0_within_2_s_and_releases_the_lock(
    child_env: dict[str, str], conn: psycopg.Connection[Any], settings: Settings, tmp_path: Path
) -> None:
    with relay_processes(child_env, 2, tmp_path) as procs:
        leader, standby = start_pair(conn)
        held_by = leader_pid(conn, settings.relay_lock_key)
        procs[leader].send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = procs[leader].wait(timeout=5)
        exit_time = time.monotonic() - sent
        # released, not left to die with the session: the standby has it at its next retry
        wait_until(lambda: current_leader(conn) == f"relay-t{standby}", 2, message="standby takes the lock")
        assert leader_pid(conn, settings.relay_lock_key) not in (None, held_by)
        assert roles(conn)[f"relay-t{leader}"][0] == "stopped"
        rows = enqueue_sql(conn, 3)
        wait_until(lambda: not unpublished(conn, rows), 5, message="the new leader publishes")
        procs[standby].send_signal(signal.SIGINT)
        standby_code = procs[standby].wait(timeout=5)
    assert code == 0
    assert exit_time < 2.0
    assert standby_code == 0
    assert leader_pid(conn, settings.relay_lock_key) is None
    assert {role for role, _ in roles(conn).values()} == {"stopped"}
    assert "stopped" in log_text(tmp_path, leader)


def test_relay_cli_refuses_bad_settings(child_env: dict[str, str]) -> None:
    env = dict(child_env, POSTBOX_RELAY_BATCH_SIZE="0")
    done = subprocess.run([sys.executable, "-m", "postbox.relay", "run"], env=env, capture_output=True, timeout=30)
    assert done.returncode == 2
    assert b"POSTBOX_RELAY_BATCH_SIZE" in done.stderr


def test_sigterm_under_a_backlog_finishes_the_batch_in_hand_and_exits_within_2_s(
    child_env: dict[str, str], conn: psycopg.Connection[Any], settings: Settings, tmp_path: Path
) -> None:
    conn.execute("INSERT INTO postbox.outbox (queue, task) SELECT 'default', 'noop' FROM generate_series(1, 30000)")
    conn.commit()
    env = dict(child_env, POSTBOX_RELAY_BATCH_SIZE="200")

    def published() -> int:
        conn.commit()
        row = conn.execute("SELECT count(*) FROM postbox.outbox WHERE published_at IS NOT NULL").fetchone()
        conn.commit()
        return int(row[0]) if row else 0

    with relay_processes(env, 1, tmp_path) as procs:
        wait_until(lambda: published() >= 1000, 20, message="publishing under way")
        procs[0].send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = procs[0].wait(timeout=5)
        took = time.monotonic() - sent
    assert code == 0
    assert took < 2.0
    conn.commit()
    marked = {r[0] for r in conn.execute("SELECT id FROM postbox.outbox WHERE published_at IS NOT NULL").fetchall()}
    assert 1000 <= len(marked) < 30000  # it stopped in the middle of the backlog ...
    counts = asyncio.run(stream_id_counts(settings))
    assert set(counts) == marked  # ... and every row it sent was also marked: no batch left half done
    assert leader_pid(conn, settings.relay_lock_key) is None
