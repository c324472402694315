"""Where the test servers come from: URLs, a Docker engine, or embedded packages.

Order: ``POSTBOX_TEST_DATABASE_URL`` / ``POSTBOX_TEST_REDIS_URL`` when set; else
testcontainers when a Docker engine answers; else the embedded servers from
PyPI (``app.embedded``), so ``make test`` works on a machine with only Python.
A server that cannot be had fails the run: nothing is skipped for it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Servers:
    database_url: str  # an admin URL: may CREATE DATABASE
    redis_url: str
    source: str
    stoppers: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        while self.stoppers:
            self.stoppers.pop()()


def _docker_available() -> bool:
    try:
        from testcontainers.core.docker_client import DockerClient  # type: ignore[import-not-found]

        DockerClient().client.ping()
        return True
    except Exception:
        return False


def _from_containers() -> Servers:
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]
    from testcontainers.redis import RedisContainer  # type: ignore[import-not-found]

    pg = PostgresContainer("postgres:18", driver=None).start()
    rd = RedisContainer("redis:7").start()
    redis_url = f"redis://{rd.get_container_host_ip()}:{rd.get_exposed_port(6379)}/0"
    return Servers(pg.get_connection_url(), redis_url, "testcontainers", [pg.stop, rd.stop])


def _from_embedded() -> Servers:
    from postbox_examples.embedded import EmbeddedServers

    root = Path(os.environ.get("POSTBOX_TEST_STATE_DIR") or Path(tempfile.gettempdir()) / "postbox-test-servers")
    servers = EmbeddedServers(root)
    database_url, redis_url = servers.start()
    return Servers(database_url, redis_url, "embedded", [servers.stop])


def acquire() -> Servers:
    db = os.environ.get("POSTBOX_TEST_DATABASE_URL")
    rd = os.environ.get("POSTBOX_TEST_REDIS_URL")
    if db and rd:
        return Servers(db, rd, "environment")
    if db or rd:
        raise RuntimeError("set both POSTBOX_TEST_DATABASE_URL and POSTBOX_TEST_REDIS_URL, or neither")
    if os.environ.get("POSTBOX_TEST_NO_DOCKER") != "1" and _docker_available():
        return _from_containers()
    return _from_embedded()
