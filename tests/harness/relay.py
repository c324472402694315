"""Helpers shared by the relay's integration and system tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import redis.asyncio as aioredis

from postbox.relay import Relay, RelaySignals
from postbox.settings import Settings
from postbox.streams import decode_entry, queue_streams
from tests.harness.fleet import kill

Predicate = Callable[[], Any]


@asynccontextmanager
async def running_relay(settings: Settings, **options: Any) -> AsyncIterator[tuple[Relay, RelaySignals]]:
    """A relay running in this event loop; stopped (and awaited) on exit."""
    signals = options.pop("signals", None) or RelaySignals.all()
    relay = Relay(settings, signals=signals, **options)
    task = asyncio.create_task(relay.run())
    try:
        yield relay, signals
    finally:
        relay.stop()
        await asyncio.wait_for(task, timeout=10)


def enqueue_sql(
    conn: psycopg.Connection[Any],
    n: int = 1,
    *,
    queue: str = "default",
    priority: int = 5,
    delay: float = 0.0,
    commit: bool = True,
) -> list[int]:
    """Insert ``n`` noop jobs with the SQL function and commit (unless told not to); return their ids."""
    ids = []
    for _ in range(n):
        row = conn.execute(
            "SELECT postbox.enqueue('noop', '{}'::jsonb, %s, %s, now() + make_interval(secs => %s))",
            (queue, priority, delay),
        ).fetchone()
        assert row is not None
        ids.append(int(row[0]))
    if commit:
        conn.commit()
    return ids


async def lose_prefix(redis: aioredis.Redis, prefix: str) -> int:
    """Redis "loses its data" for this test only: every key under ``prefix`` deleted (streams, groups, the
    epoch key). A FLUSHDB on the shared server took the keys of the tests running beside it too."""
    keys = [key async for key in redis.scan_iter(match=f"{prefix}:*", count=1000)]
    for start in range(0, len(keys), 500):
        await redis.delete(*keys[start : start + 500])
    return len(keys)


async def entries(redis: aioredis.Redis, prefix: str, queue: str = "default") -> list[dict[str, Any]]:
    """Every entry of the queue's streams (highest priority first), decoded, with ``_sid`` and ``_key``."""
    found: list[dict[str, Any]] = []
    for key in queue_streams(prefix, queue):
        for sid, fields in await redis.xrange(key):
            entry: dict[str, Any] = dict(decode_entry(fields))
            entry["_sid"] = sid.decode()
            entry["_key"] = key
            found.append(entry)
    return found


async def entry_ids(redis: aioredis.Redis, prefix: str, queue: str = "default") -> list[int]:
    return sorted(int(e["id"]) for e in await entries(redis, prefix, queue))


def states(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, int]]:
    """id -> (state, publish_count), read in a fresh transaction."""
    conn.commit()
    rows = conn.execute("SELECT id, state, publish_count FROM postbox.outbox ORDER BY id").fetchall()
    conn.commit()
    return {r[0]: (r[1], r[2]) for r in rows}


def leader_pid(conn: psycopg.Connection[Any], lock_key: int) -> int | None:
    """Backend pid of the session holding the relay lock in this database, if any."""
    conn.commit()
    row = conn.execute(
        """SELECT pid FROM pg_locks
            WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database
                                                                     WHERE datname = current_database())
              AND classid = %s AND objid = %s""",
        ((lock_key >> 32) & 0xFFFFFFFF, lock_key & 0xFFFFFFFF),
    ).fetchone()
    conn.commit()
    return int(row[0]) if row else None


# --- relay processes -------------------------------------------------------------------


@contextmanager
def relay_processes(env: dict[str, str], n: int, log_dir: Any) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` real relay processes (``python -m postbox.relay run``); killed on exit.

    Logs go to log_dir/relay-<i>.log.
    """
    procs: list[subprocess.Popen[bytes]] = []
    files = []
    try:
        for i in range(n):
            log_file = open(os.path.join(str(log_dir), f"relay-{i}.log"), "wb")
            files.append(log_file)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "postbox.relay", "run", "--relay-id", f"relay-t{i}"],
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            )
        yield procs
    finally:
        kill(procs)
        for log_file in files:
            log_file.close()


def relay_role(conn: psycopg.Connection[Any], relay_id: str) -> str | None:
    conn.commit()
    row = conn.execute("SELECT role FROM postbox.relays WHERE id = %s", (relay_id,)).fetchone()
    conn.commit()
    return str(row[0]) if row else None
