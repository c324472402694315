"""Fixtures for every suite.

- ``servers``: the PostgreSQL and Redis the run uses (session; see harness/servers.py).
- ``database_url``: a fresh database per test, copied from a migrated template.
- ``redis_url`` + ``redis_prefix``: an isolated key prefix per test; its keys are deleted after.
- ``settings``: :class:`jobs.Settings` pointing at both.
- ``child_env``: the environment for a postbox subprocess using the same servers.

Unit tests (tests/unit) use none of these and need no servers.

A test marked ``alone`` runs with no other test beside it when the suite runs
on several processes (``make test``: see harness/alone.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import redis as syncredis
import redis.asyncio as aioredis

from postbox.settings import Settings
from tests.harness import alone, databases
from tests.harness.redis_server import private_redis  # noqa: F401 - a fixture for every suite
from tests.harness.servers import Servers, acquire

# The sample Django project has its own pytest-django suite, run by tests/system/test_django_project.py.
collect_ignore = ["django_project"]


def pytest_configure(config: pytest.Config) -> None:
    """The controlling process of an xdist run names the run, to remove its lock files after it."""
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", None):
        alone.remove(config.option.testrunuid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Set-up, call and teardown inside the test's turn (exclusive for ``alone`` tests)."""
    with alone.turn(item.get_closest_marker(alone.MARKER) is not None):
        return (yield)


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    try:
        found = acquire()
    except Exception as exc:  # a missing server fails the run, never skips it
        pytest.exit(f"no test servers: {exc}", returncode=3)
    try:
        with psycopg.connect(found.database_url, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
        syncredis.Redis.from_url(found.redis_url, socket_connect_timeout=10).ping()
    except Exception as exc:
        found.stop()
        pytest.exit(f"test servers unreachable ({found.source}): {exc}", returncode=3)
    yield found
    found.stop()


@pytest.fixture(scope="session")
def template_db(servers: Servers) -> Iterator[str]:
    databases.drop_abandoned(servers.database_url)
    name = databases.create_template(servers.database_url)
    yield name
    databases.drop(servers.database_url, name)


@pytest.fixture(scope="session")
def database_copies(servers: Servers, template_db: str) -> Iterator[databases.Copies]:
    copies = databases.Copies(servers.database_url, template_db)
    yield copies
    copies.close()


@pytest.fixture
def database_url(servers: Servers, database_copies: databases.Copies) -> Iterator[str]:
    """A fresh copy of the migrated template, this test's alone; dropped after it."""
    name = database_copies.take()
    yield databases.with_database(servers.database_url, name)
    database_copies.give_back(name)


@pytest.fixture
def empty_database_url(servers: Servers) -> Iterator[str]:
    """A database with no schema at all (for migration tests)."""
    name = databases.create(servers.database_url, "e")
    yield databases.with_database(servers.database_url, name)
    databases.drop(servers.database_url, name)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url) as connection:
        yield connection


@pytest.fixture
async def aconn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    connection = await psycopg.AsyncConnection.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
def redis_url(servers: Servers) -> str:
    return servers.redis_url


@pytest.fixture
def redis_prefix(servers: Servers) -> Iterator[str]:
    prefix = f"pbxt-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = syncredis.Redis.from_url(servers.redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def settings(database_url: str, redis_url: str, redis_prefix: str, tmp_path: Any) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        poll_interval=0.2,
        # An in-process app (TestClient) runs its loop in a thread beside the test's own work, so on a
        # busy machine its loop runs late and the lag shedder would answer 503 to the test's requests.
        # Shedding by lag has its own test (tests/unit/test_api_shedder.py); API processes keep the default.
        api_max_loop_lag=0.0,
    )


@pytest.fixture
def child_env(settings: Settings, tmp_path: Any) -> dict[str, str]:
    """Environment for a postbox child process on this test's database and prefix."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        POSTBOX_DATABASE_URL=str(settings.database_url),
        POSTBOX_REDIS_URL=str(settings.redis_url),
        POSTBOX_REDIS_PREFIX=settings.redis_prefix,
        POSTBOX_STATE_DIR=str(tmp_path / "state"),  # the example's (blob store, demo servers): a test's own
        POSTBOX_POLL_INTERVAL=str(settings.poll_interval),
        PYTHONUNBUFFERED="1",
    )
    return env
