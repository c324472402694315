"""The test harness's own Redis servers: distinct ports, and a server that starts is the one that answers.

(A Redis Cluster fixture once got the same port for two of its nodes: the second
node's bind failed while the first answered its ping, and the cluster never formed.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.harness.redis_server import RedisServer, free_port


def test_free_ports_asked_together_are_distinct() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


class _Mute(RedisServer):
    """A process that starts and stays up but never listens: whatever answers on its port is another server."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_server_whose_port_another_server_answers_on_fails_to_start(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    second = _Mute(tmp_path / "second", port=private_redis.port)
    with pytest.raises(RuntimeError, match=f"port {private_redis.port} is served by another process"):
        second.start()
    assert second.proc is not None and second.proc.poll() is not None  # its own process is gone
    assert private_redis.client().ping()  # the first one is untouched
