"""What a process says when it cannot work: no postbox schema, a standby's wait, and one list of queues.

Each refusal names its fix (``postbox migrate``), each wait what it waits on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from postbox import migrate
from postbox.errors import SchemaOutdatedError
from postbox.producer import enqueue, enqueue_async, enqueue_many
from postbox.registry import default_registry
from postbox.relay import Relay
from postbox.settings import Settings
from tests.harness.api import make_client
from tests.harness.relay import running_relay
from tests.harness.tasks import api as api_tasks
from tests.harness.wait import wait_event, wait_until_async

MIGRATE = "run `postbox migrate`"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the producer ------------------------------------------------------------------------------


def test_enqueue_on_an_unmigrated_database_names_postbox_migrate(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url) as conn:
        with pytest.raises(SchemaOutdatedError, match="run `postbox migrate`") as caught:
            enqueue(conn, api_tasks.api_sum, {"a": 1, "b": 2})
        assert 'relation "postbox.outbox" does not exist' in str(caught.value)
        assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)
        conn.rollback()
        with pytest.raises(SchemaOutdatedError, match=MIGRATE):
            enqueue_many(conn, [{"task": "api_sum", "args": {"a": 1, "b": 2}}])
        conn.rollback()
        # The caller's own missing table is the caller's error, unchanged.
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM app_orders")


async def test_enqueue_async_on_an_unmigrated_database_names_postbox_migrate(empty_database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_database_url) as conn:
        with pytest.raises(SchemaOutdatedError, match=MIGRATE):
            await enqueue_async(conn, api_tasks.api_sum, {"a": 1, "b": 2})


# --- the API -----------------------------------------------------------------------------------


def test_api_on_an_unmigrated_database_answers_503_naming_postbox_migrate(
    settings: Settings, empty_database_url: str
) -> None:
    with make_client(settings, database_url=empty_database_url) as client:
        ready = client.get("/ready")
        assert ready.status_code == 503
        error = ready.json()["error"]
        assert error["details"]["failing"] == ["migrations"]
        assert error["details"]["checks"]["migrations"] == f"no postbox schema: {MIGRATE}"
        for path in ("/api/v1/queues", "/api/v1/jobs"):
            answer = client.get(path)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "SCHEMA_OUTDATED"
            assert answer.json()["error"]["message"].endswith(MIGRATE)


def test_ready_names_postbox_migrate_for_an_older_schema(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE postbox.alembic_version SET version_num = '0001_outbox'")
    conn.commit()
    with make_client(settings) as client:
        checks = client.get("/ready").json()["error"]["details"]["checks"]
    assert checks["migrations"] == f"at 0001_outbox, head is {migrate.head_revision()}: {MIGRATE}"


# --- the relay ---------------------------------------------------------------------------------


async def test_a_relay_on_an_unmigrated_database_stops_naming_postbox_migrate(
    settings: Settings, empty_database_url: str
) -> None:
    relay = Relay(settings.model_copy(update={"database_url": empty_database_url}))
    with pytest.raises(SchemaOutdatedError, match=MIGRATE):
        await asyncio.wait_for(relay.run(), timeout=30)  # before: it logged the error every 0.5 s, forever
    assert relay.role == "stopped"


async def test_a_standby_says_which_relay_holds_the_lock(settings: Settings) -> None:
    async with running_relay(settings, relay_id="relay-a") as (_, a_signals):
        await wait_event(a_signals.leader, 10)
        async with running_relay(settings, relay_id="relay-b") as (b, b_signals):
            await wait_event(b_signals.standby, 10)
            waiting = await wait_until_async(lambda: b.waiting_on, 10, message="the standby's report")
    assert waiting.startswith(f"the leader lock (key {settings.relay_lock_key}), held by relay-a (host ")
    assert "Redis" not in waiting


async def test_a_standby_with_a_redis_that_does_not_answer_says_so(settings: Settings) -> None:
    async with running_relay(settings, relay_id="relay-a") as (_, a_signals):
        await wait_event(a_signals.leader, 10)
        bad = settings.model_copy(update={"redis_url": f"redis://:s3cret@127.0.0.1:{closed_port()}/0"})
        async with running_relay(bad, relay_id="relay-b") as (b, b_signals):
            await wait_event(b_signals.standby, 10)
            waiting = await wait_until_async(lambda: "Redis" in b.waiting_on and b.waiting_on, 10)
    assert "held by relay-a" in waiting
    assert "; Redis at redis://:***@127.0.0.1:" in waiting and "does not answer" in waiting
    assert "s3cret" not in waiting


# --- one list of queues ------------------------------------------------------------------------


def test_queues_list_and_the_api_list_the_same_queues(settings: Settings, child_env: dict[str, str]) -> None:
    # The API lists the queues of the tasks it loaded; the CLI, given the same task modules
    # (POSTBOX_TASKS, as every process reads them), lists the same ones — before: "(none)".
    # Only modules a process can import (a module built in memory by another test has no spec).
    loaded = {default_registry.get(name).fn.__module__ for name in default_registry.names()}
    modules = sorted(m for m in loaded if getattr(sys.modules.get(m), "__spec__", None) is not None)

    def cli_queues(env: dict[str, str]) -> list[str]:
        argv = [sys.executable, "-m", "postbox.app", "queues", "list", "--json"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [q["queue"] for q in json.loads(done.stdout)]

    with make_client(settings) as client:  # no job enqueued yet
        api_queues = [q["queue"] for q in client.get("/api/v1/queues").json()]
    assert "apiq" in api_queues
    assert cli_queues({**child_env, "POSTBOX_TASKS": ",".join(modules)}) == api_queues
    # A worker's published task definitions are listed by the CLI without any module loaded.
    with psycopg.connect(str(settings.database_url)) as conn:
        conn.execute(
            "INSERT INTO postbox.tasks (name, queue, priority, max_attempts, keep_result)"
            " VALUES ('elsewhere', 'reports', 5, 5, false)"
        )
    assert "reports" in cli_queues(child_env)
