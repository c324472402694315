"""Unique jobs on a real PostgreSQL: period and state rules, keys, races, SQL function, REST (docs/unique-jobs.md)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

import postbox
from postbox import definitions
from postbox.app.api.main import create_app
from postbox.errors import InvalidOptionError
from postbox.registry import Registry, task
from postbox.settings import Settings
from postbox.unique import Unique
from tests.harness.wait import wait_until

REG = Registry()
WHILE_UNFINISHED = ("pending", "queued", "running", "retrying")


@task(registry=REG, queue="uq", unique=Unique(period=3600, by=("customer_id",)))
def uq_period(ctx: Any, customer_id: int, note: str = "") -> None: ...


@task(registry=REG, queue="uq", unique=Unique(states=WHILE_UNFINISHED))
def uq_states(ctx: Any, order_id: int, lang: str = "en") -> None: ...


@task(registry=REG, queue="uq", unique=Unique(period=3600, states=("pending",)))
def uq_both(ctx: Any, n: int) -> None: ...


@task(registry=REG, queue="uq")
def plain(ctx: Any, n: int) -> None: ...


def enqueue(conn: psycopg.Connection[Any], fn: Any, args: dict[str, Any], **options: Any) -> postbox.JobId:
    with conn.transaction():
        return postbox.enqueue(conn, fn, args, registry=REG, **options)


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, task, unique_key FROM postbox.outbox ORDER BY id").fetchall()


def age(conn: psycopg.Connection[Any], job_id: int, seconds: float) -> None:
    with conn.transaction():
        conn.execute(
            "UPDATE postbox.outbox SET created_at = created_at - make_interval(secs => %s) WHERE id = %s",
            (seconds, job_id),
        )


def set_state(conn: psycopg.Connection[Any], job_id: int, state: str) -> None:
    with conn.transaction():
        conn.execute("UPDATE postbox.outbox SET state = %s WHERE id = %s", (state, job_id))


def test_period_rule_a_duplicate_within_the_period_a_new_job_after(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, uq_period, {"customer_id": 1, "note": "a"})
    assert first.duplicate is False
    again = enqueue(conn, uq_period, {"customer_id": 1, "note": "b"})  # note is not part of the key
    assert (again, again.duplicate) == (first, True)
    other = enqueue(conn, uq_period, {"customer_id": 2})
    assert other != first and other.duplicate is False
    set_state(conn, first, "succeeded")  # a period rule ignores the state
    assert enqueue(conn, uq_period, {"customer_id": 1}) == first
    age(conn, first, 3601)  # the period is over
    later = enqueue(conn, uq_period, {"customer_id": 1})
    assert later.duplicate is False and later not in (first, other)
    assert enqueue(conn, uq_period, {"customer_id": 1}) == later  # the newest holds the key now
    assert rows(conn) == [
        (first, "uq_period", 'uq_period:{"customer_id": 1}'),
        (other, "uq_period", 'uq_period:{"customer_id": 2}'),
        (later, "uq_period", 'uq_period:{"customer_id": 1}'),
    ]


def test_states_rule_the_key_is_free_again_once_the_job_finishes(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, uq_states, {"order_id": 7})
    for state in WHILE_UNFINISHED:
        set_state(conn, first, state)
        found = enqueue(conn, uq_states, {"order_id": 7, "lang": "en"})  # the default, given: the same key
        assert (found, found.duplicate) == (first, True), state
    age(conn, first, 10 * 86_400)  # no period: age does not matter
    assert enqueue(conn, uq_states, {"order_id": 7}) == first
    fr = enqueue(conn, uq_states, {"order_id": 7, "lang": "fr"})
    assert fr.duplicate is False
    set_state(conn, first, "succeeded")
    second = enqueue(conn, uq_states, {"order_id": 7})
    assert second.duplicate is False and second not in (first, fr)
    assert [key for _, _, key in rows(conn)] == [
        'uq_states:{"lang": "en", "order_id": 7}',
        'uq_states:{"lang": "fr", "order_id": 7}',
        'uq_states:{"lang": "en", "order_id": 7}',
    ]


def test_period_and_states_both_must_match(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, uq_both, {"n": 1})
    assert enqueue(conn, uq_both, {"n": 1}) == first
    set_state(conn, first, "queued")  # within the period, not in the states
    second = enqueue(conn, uq_both, {"n": 1})
    assert second.duplicate is False
    age(conn, second, 3601)  # in the states, past the period
    third = enqueue(conn, uq_both, {"n": 1})
    assert third.duplicate is False
    assert len({first, second, third}) == 3


def test_a_long_key_is_hashed(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, uq_states, {"order_id": 1, "lang": "x" * 300})
    assert enqueue(conn, uq_states, {"order_id": 1, "lang": "x" * 300}) == first
    (key,) = conn.execute("SELECT unique_key FROM postbox.outbox").fetchone()  # type: ignore[misc]
    assert key.startswith("uq_states:sha256:") and len(key) == len("uq_states:sha256:") + 64


def test_the_dedup_key_is_looked_at_first(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, uq_period, {"customer_id": 1}, dedup_key="d1")
    by_dedup = enqueue(conn, uq_period, {"customer_id": 2}, dedup_key="d1")  # another unique key
    assert (by_dedup, by_dedup.duplicate) == (first, True)
    by_unique = enqueue(conn, uq_period, {"customer_id": 1}, dedup_key="d2")
    assert (by_unique, by_unique.duplicate) == (first, True)
    dedup_only = enqueue(conn, plain, {"n": 1}, dedup_key="p")
    assert dedup_only.duplicate is False and enqueue(conn, plain, {"n": 2}, dedup_key="p") == dedup_only
    assert enqueue(conn, plain, {"n": 2}, dedup_key="p").duplicate is True
    assert len(rows(conn)) == 2


def test_concurrent_enqueuers_of_one_key_make_one_job(conn: psycopg.Connection[Any], database_url: str) -> None:
    """The first holds the key's lock until it commits; the second waits, then finds its job."""
    result: list[postbox.JobId] = []
    with psycopg.connect(database_url) as other, psycopg.connect(database_url, autocommit=True) as watch:
        with conn.transaction():
            first = postbox.enqueue(conn, uq_states, {"order_id": 5}, registry=REG)
            (pid,) = other.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
            other.rollback()

            def second() -> None:
                with other.transaction():
                    result.append(postbox.enqueue(other, uq_states, {"order_id": 5}, registry=REG))

            thread = threading.Thread(target=second)
            thread.start()
            wait_until(
                lambda: (
                    watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                    == ("Lock",)
                ),
                30,
                interval=0.02,
                message="the second enqueuer waiting on the key's lock",
            )
            assert result == []
        thread.join(timeout=20)
        assert not thread.is_alive()
    assert result == [first] and result[0].duplicate is True
    assert [(job_id, task) for job_id, task, _ in rows(conn)] == [(first, "uq_states")]


def test_pipeline_mode_does_not_bypass_the_rule(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction(), conn.pipeline():
        first = postbox.enqueue(conn, uq_states, {"order_id": 9}, registry=REG)
        second = postbox.enqueue(conn, uq_states, {"order_id": 9}, registry=REG)
        plain_id = postbox.enqueue(conn, plain, {"n": 1}, registry=REG)  # still the no-reply path
    assert (second, second.duplicate, first.duplicate) == (first, True, False)
    assert plain_id.duplicate is False
    assert len(rows(conn)) == 2


def test_enqueue_many_applies_the_rule_row_by_row(conn: psycopg.Connection[Any]) -> None:
    items = [
        {"task": "uq_period", "args": {"customer_id": 1}},
        {"task": "plain", "args": {"n": 1}},
        {"task": "uq_period", "args": {"customer_id": 1, "note": "again"}},
        {"task": "uq_period", "args": {"customer_id": 2}},
    ]
    with conn.transaction():
        ids = postbox.enqueue_many(conn, items, registry=REG)
    assert ids[2] == ids[0] and len(set(ids)) == 3
    assert [getattr(i, "duplicate", None) for i in ids] == [False, False, True, False]
    with conn.transaction():
        again = postbox.enqueue_many(conn, items[:1], registry=REG)
    assert again == [ids[0]]
    assert len(rows(conn)) == 3


def test_async_enqueue_flags_the_duplicate(database_url: str) -> None:
    async def run() -> tuple[postbox.JobId, postbox.JobId]:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            async with aconn.transaction():
                first = await postbox.enqueue_async(aconn, uq_period, {"customer_id": 3}, registry=REG)
            async with aconn.transaction():
                second = await postbox.enqueue_async(aconn, uq_period, {"customer_id": 3}, registry=REG)
            return first, second

    first, second = asyncio.run(run())
    assert (first.duplicate, second, second.duplicate) == (False, first, True)


def publish(database_url: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            await definitions.publish(aconn, REG, "test")
            await aconn.commit()

    asyncio.run(run())


def test_the_sql_function_applies_the_published_rule(conn: psycopg.Connection[Any], database_url: str) -> None:
    publish(database_url)
    rules = dict(conn.execute("SELECT name, unique_rule FROM postbox.tasks ORDER BY name").fetchall())
    assert rules == {
        "plain": None,
        "uq_both": {"by": None, "defaults": {}, "period": 3600.0, "states": ["pending"]},
        "uq_period": {"by": ["customer_id"], "defaults": {}, "period": 3600.0, "states": None},
        "uq_states": {"by": None, "defaults": {"lang": "en"}, "period": None, "states": list(WHILE_UNFINISHED)},
    }
    python_id = enqueue(conn, uq_states, {"order_id": 4})

    def sql_enqueue(task_name: str, args: str) -> int:
        with conn.transaction():
            return conn.execute("SELECT postbox.enqueue(%s, %s::jsonb)", (task_name, args)).fetchone()[0]  # type: ignore[index]

    # Python's job holds the key the SQL function computes: the same key on every path, defaults filled in.
    assert sql_enqueue("uq_states", '{"order_id": 4}') == python_id
    assert sql_enqueue("uq_states", '{"lang": "en", "order_id": 4}') == python_id
    sql_id = sql_enqueue("uq_states", '{"order_id": 5}')
    assert sql_id != python_id and sql_enqueue("uq_states", '{"order_id": 5}') == sql_id
    assert enqueue(conn, uq_states, {"order_id": 5}) == sql_id
    set_state(conn, sql_id, "succeeded")
    assert sql_enqueue("uq_states", '{"order_id": 5}') not in (sql_id, python_id)
    # Dedup first in SQL too; a task without a rule is as before.
    assert sql_enqueue("uq_period", '{"customer_id": 1}') == sql_enqueue("uq_period", '{"customer_id": 1}')
    assert sql_enqueue("plain", '{"n": 1}') != sql_enqueue("plain", '{"n": 1}')
    keys = conn.execute("SELECT task, unique_key FROM postbox.outbox ORDER BY id").fetchall()
    assert keys[-2:] == [("plain", None), ("plain", None)]


def test_the_rule_is_republished_when_it_changes(conn: psycopg.Connection[Any], database_url: str) -> None:
    publish(database_url)
    other = Registry()

    @task(registry=other, name="uq_period", queue="uq")
    def uq_period_without_rule(ctx: Any, customer_id: int, note: str = "") -> None: ...

    async def run() -> int:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            changed = await definitions.publish(aconn, other, "test")
            await aconn.commit()
            return changed

    assert asyncio.run(run()) == 1
    (rule,) = conn.execute("SELECT unique_rule FROM postbox.tasks WHERE name = 'uq_period'").fetchone()  # type: ignore[misc]
    assert rule is None
    with conn.transaction():
        ids = [conn.execute("SELECT postbox.enqueue('uq_period', '{\"customer_id\": 1}')").fetchone() for _ in range(2)]
    assert ids[0] != ids[1]


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings.model_copy(update={"api_insecure": True}), registry=REG)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_rest_answers_a_duplicate_with_200_and_the_existing_job(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    created = client.post("/api/v1/jobs", json={"task": "uq_period", "args": {"customer_id": 1, "note": "a"}})
    assert created.status_code == 201, created.text
    assert created.json()["duplicate"] is False
    again = client.post("/api/v1/jobs", json={"task": "uq_period", "args": {"customer_id": 1, "note": "b"}})
    assert again.status_code == 200, again.text
    body = again.json()
    assert (body["id"], body["duplicate"], body["args"]) == (
        created.json()["id"],
        True,
        {"customer_id": 1, "note": "a"},
    )
    # The Idempotency-Key header is a dedup key: looked at first, then the rule.
    keyed = client.post(
        "/api/v1/jobs", json={"task": "uq_period", "args": {"customer_id": 2}}, headers={"Idempotency-Key": "k-1"}
    )
    assert keyed.status_code == 201
    by_header = client.post(
        "/api/v1/jobs", json={"task": "uq_period", "args": {"customer_id": 3}}, headers={"Idempotency-Key": "k-1"}
    )
    assert (by_header.status_code, by_header.json()["id"]) == (200, keyed.json()["id"])
    assert [key for _, _, key in rows(conn)] == ['uq_period:{"customer_id": 1}', 'uq_period:{"customer_id": 2}']
    # Python enqueue finds the API's job: one key for both paths.
    assert enqueue(conn, uq_period, {"customer_id": 1}) == created.json()["id"]


def test_a_bad_rule_is_refused_at_declaration_and_registers_nothing() -> None:
    reg = Registry()
    with pytest.raises(InvalidOptionError, match="unique by 'customer', which is not an argument") as info:

        @task(registry=reg, unique=Unique(period=60, by=("customer",)))
        def bad(ctx: Any, customer_id: int) -> None: ...

    assert info.value.field == "unique.by"
    with pytest.raises(InvalidOptionError, match=r"must be a postbox\.Unique"):

        @task(registry=reg, unique={"period": 60})  # type: ignore[arg-type]
        def bad_type(ctx: Any) -> None: ...

    assert len(reg) == 0


SCHEMA_OBJECTS = """
SELECT c.relname, c.relkind::text FROM pg_class c WHERE c.relnamespace = 'postbox'::regnamespace
UNION ALL
SELECT p.proname, 'function' FROM pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace
UNION ALL
SELECT a.attrelid::regclass::text || '.' || a.attname, 'column' FROM pg_attribute a
 WHERE a.attrelid IN ('postbox.outbox'::regclass, 'postbox.tasks'::regclass) AND a.attnum > 0 AND NOT a.attisdropped
"""


def schema_objects(url: str) -> set[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return set(conn.execute(SCHEMA_OBJECTS).fetchall())  # type: ignore[arg-type]


def test_0004_downgrades_to_0003_restoring_the_sql_function_and_upgrades_again(empty_database_url: str) -> None:
    from postbox import migrate

    # From 0007 (the head when this was written): later revisions add objects of their own,
    # which their own tests check (tests/integration/test_migrations.py).
    migrate.upgrade(empty_database_url, "0007_commit_time")
    everything = schema_objects(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(
            "INSERT INTO postbox.tasks (name, queue, priority, max_attempts, keep_result, unique_rule)"
            " VALUES ('t', 'default', 5, 5, false, '{\"states\": [\"pending\"]}')"
        )
        ids = [conn.execute("SELECT postbox.enqueue('t', '{\"a\": 1}')").fetchone() for _ in range(2)]
        conn.commit()
    assert ids[0] == ids[1]
    migrate.downgrade(empty_database_url, "0003_flow_control")
    assert everything - schema_objects(empty_database_url) == {
        ("unique_claim", "function"),
        ("require_current_attempt", "function"),  # 0005's
        ("begin_processed", "function"),  # 0006's
        ("record_success", "function"),
        ("outbox_unique_key", "i"),
        ("postbox.outbox.unique_key", "column"),
        ("postbox.tasks.unique_rule", "column"),
    }
    with psycopg.connect(empty_database_url) as conn:
        (source,) = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'enqueue'").fetchone()  # type: ignore[misc]
        assert "unique" not in source
        # 0001's function again: it runs (no dropped column named) and knows no rule.
        ids = [conn.execute("SELECT postbox.enqueue('t', '{\"a\": 1}')").fetchone() for _ in range(2)]
        conn.commit()
        assert ids[0] != ids[1]
    migrate.upgrade(empty_database_url, "0007_commit_time")
    assert schema_objects(empty_database_url) == everything
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("UPDATE postbox.tasks SET unique_rule = '{\"period\": 60}'")
        ids = [conn.execute("SELECT postbox.enqueue('t', '{\"a\": 2}')").fetchone() for _ in range(2)]
        assert ids[0] == ids[1]


def test_rest_answers_a_duplicate_even_when_the_queue_is_full(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"api_insecure": True, "max_queue_depth": 1}), registry=REG)
    with TestClient(app, raise_server_exceptions=False) as client:
        created = client.post("/api/v1/jobs", json={"task": "uq_states", "args": {"order_id": 1}})
        assert created.status_code == 201, created.text
        again = client.post("/api/v1/jobs", json={"task": "uq_states", "args": {"order_id": 1, "lang": "en"}})
        assert (again.status_code, again.json()["id"], again.json()["duplicate"]) == (200, created.json()["id"], True)
        other = client.post("/api/v1/jobs", json={"task": "uq_states", "args": {"order_id": 2}})
        assert (other.status_code, other.json()["error"]["code"]) == (429, "QUEUE_FULL")
