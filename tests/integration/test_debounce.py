"""Debounce and throttle (postbox.debounce / postbox.throttle) on real PostgreSQL, Redis and the worker.

Python, the SQL ``postbox.enqueue()`` and REST; twenty producers racing on one
key; a debounced job already published still runs with the last arguments.
"""

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
from postbox.relay import Relay
from postbox.settings import Settings
from postbox.unique import Unique
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue as enqueue_async_commit
from tests.harness.worker import fetch, finished, running_worker

REG = Registry()


@task(registry=REG, queue="dq", unique=postbox.debounce(60, by="doc"))
def recompute(ctx: Any, doc: str, version: int = 0) -> None: ...


@task(registry=REG, queue="dq", unique=postbox.debounce(60, by=("doc",), merge=True))
def merged(ctx: Any, doc: str, **fields: Any) -> None: ...


@task(registry=REG, queue="dq", unique=postbox.throttle(60, by="user"))
def notify(ctx: Any, user: int, text: str = "") -> None: ...


def enqueue(conn: psycopg.Connection[Any], fn: Any, args: dict[str, Any], **options: Any) -> postbox.JobId:
    with conn.transaction():
        return postbox.enqueue(conn, fn, args, registry=REG, **options)


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, task, args, state, round(extract(epoch FROM available_at - created_at)) FROM postbox.outbox"
        " ORDER BY id"
    ).fetchall()


def test_a_burst_collapses_into_one_job_due_after_the_window_with_the_last_args(
    conn: psycopg.Connection[Any],
) -> None:
    first = enqueue(conn, recompute, {"doc": "a", "version": 1})
    second = enqueue(conn, recompute, {"doc": "a", "version": 2})
    other = enqueue(conn, recompute, {"doc": "b", "version": 1})
    third = enqueue(conn, recompute, {"doc": "a", "version": 3})
    assert (first.duplicate, second, second.duplicate, other.duplicate, third, third.duplicate) == (
        False,
        first,
        True,
        False,
        first,
        True,
    )
    assert jobs(conn) == [
        (first, "recompute", {"doc": "a", "version": 3}, "pending", 60),
        (other, "recompute", {"doc": "b", "version": 1}, "pending", 60),
    ]
    # A job a worker has claimed takes no more arguments: the next enqueue is a new job.
    conn.execute("UPDATE postbox.outbox SET state = 'running' WHERE id = %s", (first,))
    conn.commit()
    fourth = enqueue(conn, recompute, {"doc": "a", "version": 4})
    assert fourth not in (first, other) and not fourth.duplicate
    assert jobs(conn)[-1] == (fourth, "recompute", {"doc": "a", "version": 4}, "pending", 60)
    # Past the window (from the first job's creation) a key starts a new job too.
    conn.execute("UPDATE postbox.outbox SET created_at = created_at - interval '61 s' WHERE id = %s", (fourth,))
    conn.commit()
    fifth = enqueue(conn, recompute, {"doc": "a", "version": 5})
    assert fifth != fourth and not fifth.duplicate


def test_merge_mode_merges_the_arguments_and_an_own_delay_is_kept(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, merged, {"doc": "d", "title": "x"}, delay=5)
    assert enqueue(conn, merged, {"doc": "d", "body": "y"}) == first
    assert enqueue(conn, merged, {"doc": "d", "title": "z"}) == first
    assert jobs(conn) == [(first, "merged", {"doc": "d", "title": "z", "body": "y"}, "pending", 5)]


def test_throttle_keeps_the_first_job_of_a_window(conn: psycopg.Connection[Any]) -> None:
    first = enqueue(conn, notify, {"user": 1, "text": "first"})
    assert enqueue(conn, notify, {"user": 1, "text": "second"}) == first
    other = enqueue(conn, notify, {"user": 2, "text": "other"})
    assert jobs(conn) == [
        (first, "notify", {"user": 1, "text": "first"}, "pending", 0),
        (other, "notify", {"user": 2, "text": "other"}, "pending", 0),
    ]


@pytest.mark.parametrize("fn", [recompute, notify])
def test_twenty_racing_producers_leave_exactly_one_job_per_key(
    fn: Any, conn: psycopg.Connection[Any], database_url: str
) -> None:
    key = "doc" if fn is recompute else "user"
    barrier = threading.Barrier(20)
    answers: list[postbox.JobId] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        with psycopg.connect(database_url) as own:
            barrier.wait(10)
            args = {"doc": "k", "version": n} if key == "doc" else {"user": 7, "text": str(n)}
            with own.transaction():
                job = postbox.enqueue(own, fn, args, registry=REG)
            with lock:
                answers.append(job)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 20 and len(set(answers)) == 1
    assert sorted(a.duplicate for a in answers) == [False] + [True] * 19
    rows = jobs(conn)
    assert [(r[0], r[1], r[3]) for r in rows] == [(answers[0], fn.__name__, "pending")]
    if fn is recompute:  # the last producer to take the key's lock wrote the job's arguments
        winner = rows[0][2]["version"]
        assert winner in range(20)


def publish(database_url: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            await definitions.publish(aconn, REG, "test")
            await aconn.commit()

    asyncio.run(run())


def test_the_sql_function_debounces_and_throttles_like_python(conn: psycopg.Connection[Any], database_url: str) -> None:
    publish(database_url)
    rules = dict(conn.execute("SELECT name, unique_rule FROM postbox.tasks WHERE name <> 'merged'").fetchall())
    assert rules == {
        "recompute": {
            "by": ["doc"],
            "defaults": {},
            "period": 60.0,
            "states": ["pending", "queued"],
            "debounce": "last",
        },
        "notify": {"by": ["user"], "defaults": {}, "period": 60.0, "states": None},
    }

    def sql_enqueue(task_name: str, args: str) -> int:
        with conn.transaction():
            return conn.execute("SELECT postbox.enqueue(%s, %s::jsonb)", (task_name, args)).fetchone()[0]  # type: ignore[index]

    python_id = enqueue(conn, recompute, {"doc": "s", "version": 1})
    assert sql_enqueue("recompute", '{"doc": "s", "version": 2}') == python_id
    sql_id = sql_enqueue("recompute", '{"doc": "t", "version": 1}')
    assert enqueue(conn, recompute, {"doc": "t", "version": 9}) == sql_id
    throttled = sql_enqueue("notify", '{"user": 3}')
    assert sql_enqueue("notify", '{"user": 3, "text": "again"}') == throttled
    assert jobs(conn) == [
        (python_id, "recompute", {"doc": "s", "version": 2}, "pending", 60),
        (sql_id, "recompute", {"doc": "t", "version": 9}, "pending", 60),  # due after the window from SQL too
        (throttled, "notify", {"user": 3}, "pending", 0),
    ]


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings.model_copy(update={"api_insecure": True}), registry=REG)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_rest_returns_the_surviving_job(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    created = client.post("/api/v1/jobs", json={"task": "recompute", "args": {"doc": "r", "version": 1}})
    again = client.post("/api/v1/jobs", json={"task": "recompute", "args": {"doc": "r", "version": 2}})
    assert (created.status_code, again.status_code) == (201, 200)
    assert (again.json()["id"], again.json()["duplicate"], again.json()["args"]) == (
        created.json()["id"],
        True,
        {"doc": "r", "version": 2},
    )
    assert [r[2] for r in jobs(conn)] == [{"doc": "r", "version": 2}]


def test_bad_debounce_and_throttle_rules_are_refused() -> None:
    with pytest.raises(InvalidOptionError, match="unique period must be > 0"):
        postbox.debounce(0, by="doc")
    with pytest.raises(InvalidOptionError, match="debounce must be one of last, merge"):
        Unique(period=5, states=("pending", "queued"), debounce="first")
    with pytest.raises(InvalidOptionError, match="a debounce rule has a window"):
        Unique(period=5, debounce="last")
    with pytest.raises(InvalidOptionError, match=r"unique\.by must be a tuple of names"):
        postbox.throttle(5, by=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="not an argument of the handler"):

        @task(registry=Registry(), unique=postbox.debounce(5, by="nope"))
        def bad(ctx: Any, doc: str) -> None: ...


async def test_a_published_debounced_job_runs_with_the_last_arguments(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    """A job published within its window (it gave its own delay: none) takes later arguments until a worker
    claims it; the worker reads them in PostgreSQL at the claim, not from the stream entry."""
    aconn = effects
    job_id = await enqueue_async_commit(aconn, t.w_debounced, {"doc": "p", "version": 1}, delay=0)
    assert await enqueue_async_commit(aconn, t.w_debounced, {"doc": "p", "version": 2}) == job_id
    # Once the relay has published it (version 2 in its stream entry), change it once more (5 s window).
    await wait_until_async(lambda: relay.published_total >= 1, 10, message="the debounced job published")
    assert await enqueue_async_commit(aconn, t.w_debounced, {"doc": "p", "version": 3}) == job_id
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT label, attempt FROM worker_effects") == [("p:v3", 1)]
    assert await fetch(aconn, "SELECT count(*), max(publish_count) FROM postbox.outbox") == [(1, 1)]
