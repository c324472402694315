"""The producer API on a real PostgreSQL: transactions, bulk, SQL function, dedup, bad input."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import postbox
from postbox import errors
from tests.harness.tasks import core as tasks_core


def count(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) FROM postbox.outbox").fetchone()[0]  # type: ignore[index]


def test_rollback_leaves_no_row(conn: psycopg.Connection[Any], database_url: str) -> None:
    with pytest.raises(RuntimeError), conn.transaction():
        conn.execute("CREATE TABLE IF NOT EXISTS biz (id int)")
        job_id = postbox.enqueue(conn, tasks_core.noop)
        assert job_id > 0
        raise RuntimeError("business failure")
    assert count(conn) == 0


def test_nothing_is_visible_before_commit(conn: psycopg.Connection[Any], database_url: str) -> None:
    with psycopg.connect(database_url) as other:
        with conn.transaction():
            postbox.enqueue(conn, tasks_core.noop)
            assert count(other) == 0
            other.rollback()
        assert count(other) == 1


def test_commit_leaves_one_row_with_every_field(conn: psycopg.Connection[Any]) -> None:
    run_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    with conn.transaction():
        job_id = postbox.enqueue(
            conn,
            "send_welcome",
            {"user_id": 42, "lang": "fr"},
            queue="welcome",
            priority=8,
            run_at=run_at,
            max_attempts=4,
            dedup_key="user-42",
            headers={"request_id": "r-1", "traceparent": "00-abc-def-01"},
        )
    row = conn.execute(
        "SELECT id, queue, task, args, priority, state, attempts, max_attempts, available_at, dedup_key,"
        " headers, published_at, finished_at FROM postbox.outbox"
    ).fetchall()
    assert row == [
        (
            job_id,
            "welcome",
            "send_welcome",
            {"user_id": 42, "lang": "fr"},
            8,
            "pending",
            0,
            4,
            run_at,
            "user-42",
            {"request_id": "r-1", "traceparent": "00-abc-def-01"},
            None,
            None,
        )
    ]


def test_delay_is_measured_by_the_database_clock(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        job_id = postbox.enqueue(conn, tasks_core.noop, delay=timedelta(minutes=10))
    gap = conn.execute("SELECT available_at - created_at FROM postbox.outbox WHERE id = %s", (job_id,)).fetchone()[0]  # type: ignore[index]
    assert timedelta(minutes=10) <= gap < timedelta(minutes=10, seconds=1)


async def test_async_rollback_and_commit(aconn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(RuntimeError):
        async with aconn.transaction():
            await postbox.enqueue_async(aconn, tasks_core.noop)
            raise RuntimeError("rollback")
    async with aconn.transaction():
        job_id = await postbox.enqueue_async(aconn, tasks_core.send_welcome, {"user_id": 7}, priority=2)
    rows = await (await aconn.execute("SELECT id, task, args, priority, queue FROM postbox.outbox")).fetchall()
    assert rows == [(job_id, "send_welcome", {"user_id": 7}, 2, "mail")]


def test_enqueue_many_ten_thousand_in_one_call(conn: psycopg.Connection[Any]) -> None:
    items = [{"task": "send_welcome", "args": {"user_id": i}, "priority": i % 10} for i in range(10_000)]
    with conn.transaction():
        ids = postbox.enqueue_many(conn, items)
    assert len(ids) == 10_000 and len(set(ids)) == 10_000
    rows = dict(conn.execute("SELECT id, (args->>'user_id')::int FROM postbox.outbox").fetchall())
    assert [rows[job_id] for job_id in ids] == list(range(10_000))
    assert conn.execute("SELECT count(*), count(DISTINCT priority) FROM postbox.outbox").fetchone() == (10_000, 10)


async def test_enqueue_many_async_with_dedup_keys(aconn: psycopg.AsyncConnection[Any]) -> None:
    async with aconn.transaction():
        first = await postbox.enqueue_async(aconn, tasks_core.noop, dedup_key="k1")
        ids = await postbox.enqueue_many_async(
            aconn,
            [
                {"task": "noop", "dedup_key": "k1"},
                {"task": "noop"},
                {"task": "noop", "dedup_key": "k2"},
                {"task": "noop", "dedup_key": "k2"},
                {"task": "noop", "dedup_key": "k1", "queue": "other"},
            ],
        )
    assert ids[0] == first
    assert ids[2] == ids[3]
    assert len({first, ids[1], ids[2], ids[4]}) == 4
    total = await (await aconn.execute("SELECT count(*) FROM postbox.outbox")).fetchone()
    assert total == (4,)


def test_sql_function_from_plain_sql(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        job_id = conn.execute(
            "SELECT postbox.enqueue('send_welcome', '{\"user_id\": 3}'::jsonb, 'mail', 9, now(), 'sql-key', 2)"
        ).fetchone()[0]  # type: ignore[index]
        again = conn.execute(
            "SELECT postbox.enqueue('send_welcome', '{\"user_id\": 3}'::jsonb, 'mail', 9, now(), 'sql-key')"
        ).fetchone()[0]  # type: ignore[index]
        default = conn.execute("SELECT postbox.enqueue('noop', '{}')").fetchone()[0]  # type: ignore[index]
    assert again == job_id
    assert conn.execute(
        "SELECT task, queue, priority, max_attempts, state FROM postbox.outbox ORDER BY id"
    ).fetchall() == [
        ("send_welcome", "mail", 9, 2, "pending"),
        ("noop", "default", 5, 5, "pending"),
    ]
    assert default != job_id


@pytest.mark.parametrize(
    "call",
    [
        "SELECT postbox.enqueue('t', '[]'::jsonb)",
        "SELECT postbox.enqueue('t', '{}', 'Bad Queue')",
        "SELECT postbox.enqueue('t', '{}', 'q', 10)",
        "SELECT postbox.enqueue('t', '{}', 'q', 5, now(), NULL, 0)",
        "SELECT postbox.enqueue('', '{}')",
    ],
)
def test_sql_function_rejects_bad_input(conn: psycopg.Connection[Any], call: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute(call)
    conn.rollback()
    assert count(conn) == 0


def test_twenty_concurrent_producers_on_one_dedup_key(database_url: str) -> None:
    barrier = threading.Barrier(20, timeout=30)  # a producer that cannot connect breaks it, never hangs it
    results: list[int] = []
    lock = threading.Lock()

    def produce() -> None:
        try:
            own = psycopg.connect(database_url)
        except psycopg.OperationalError:
            barrier.abort()
            raise
        with own:
            barrier.wait()
            with own.transaction():
                job_id = postbox.enqueue(own, tasks_core.noop, dedup_key="race")
            with lock:
                results.append(job_id)

    threads = [threading.Thread(target=produce, daemon=True) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 20
    assert len(set(results)) == 1
    with psycopg.connect(database_url) as check:
        assert check.execute("SELECT id, task, queue, dedup_key, state FROM postbox.outbox").fetchall() == [
            (results[0], "noop", "default", "race", "pending")
        ]


async def test_twenty_concurrent_async_producers_on_one_dedup_key(database_url: str) -> None:
    async def produce() -> int:
        async with await psycopg.AsyncConnection.connect(database_url) as own, own.transaction():
            return await postbox.enqueue_async(own, tasks_core.noop, dedup_key="race")

    results = await asyncio.gather(*(produce() for _ in range(20)))
    assert len(set(results)) == 1
    async with await psycopg.AsyncConnection.connect(database_url) as check:
        cur = await check.execute("SELECT id, task, queue, dedup_key, state FROM postbox.outbox")
        assert await cur.fetchall() == [(results[0], "noop", "default", "race", "pending")]


def test_dedup_is_scoped_per_queue(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        a = postbox.enqueue(conn, tasks_core.noop, dedup_key="same", queue="a")
        b = postbox.enqueue(conn, tasks_core.noop, dedup_key="same", queue="b")
    assert a != b and count(conn) == 2


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"task": "no_such_task"}, errors.UnknownTaskError),
        ({"task": "noop", "queue": "NOPE!"}, errors.InvalidQueueError),
        ({"task": "noop", "priority": 11}, errors.InvalidPriorityError),
        ({"task": "noop", "args": ["not", "an", "object"]}, errors.InvalidArgsError),
        ({"task": "send_welcome", "args": {"user_id": "abc"}}, errors.InvalidArgsError),
        ({"task": "send_welcome", "args": {"user_id": 1, "lang": "x" * 300_000}}, errors.PayloadTooLargeError),
        ({"task": "noop", "delay": 5, "run_at": datetime.now(UTC)}, errors.ScheduleConflictError),
        ({"task": "noop", "max_attempts": 0}, errors.InvalidMaxAttemptsError),
    ],
)
def test_bad_input_writes_nothing(conn: psycopg.Connection[Any], kwargs: dict[str, Any], error: type) -> None:
    kwargs = dict(kwargs)
    task = kwargs.pop("task")
    args = kwargs.pop("args", None)
    with conn.transaction():
        with pytest.raises(error):
            postbox.enqueue(conn, task, args, **kwargs)
        with pytest.raises(error):
            postbox.enqueue_many(conn, [{"task": "noop"}, {"task": task, "args": args, **kwargs}])
    assert count(conn) == 0


def test_insert_notifies_the_relay_channel(conn: psycopg.Connection[Any], database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN postbox_outbox")
        with conn.transaction():
            postbox.enqueue_many(conn, [{"task": "noop"}] * 50)
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in got] == ["postbox_outbox"]


def test_enqueue_many_without_keys_keeps_every_option_and_the_database_clock(conn: psycopg.Connection[Any]) -> None:
    run_at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    with conn.transaction():
        ids = postbox.enqueue_many(
            conn,
            [
                {"task": "noop"},
                {"task": "noop", "delay": 60, "priority": 9, "headers": {"request_id": "r-9"}},
                {"task": "send_welcome", "args": {"user_id": 5}, "run_at": run_at, "max_attempts": 2},
            ],
        )
    rows = conn.execute(
        "SELECT id, task, args, priority, max_attempts, headers, available_at - created_at, available_at, state"
        " FROM postbox.outbox ORDER BY id"
    ).fetchall()
    assert [row[0] for row in rows] == ids == sorted(ids)
    assert rows[0][1:7] == ("noop", {}, 5, 5, {}, timedelta(0))
    assert rows[1][1:7] == ("noop", {}, 9, 5, {"request_id": "r-9"}, timedelta(seconds=60))
    assert rows[2][1:5] == ("send_welcome", {"user_id": 5}, 7, 2) and rows[2][7] == run_at
    assert {row[8] for row in rows} == {"pending"}


async def test_enqueue_many_async_without_keys(aconn: psycopg.AsyncConnection[Any]) -> None:
    async with aconn.transaction():
        ids = await postbox.enqueue_many_async(
            aconn, [{"task": "send_welcome", "args": {"user_id": i}} for i in range(500)]
        )
    rows = await (await aconn.execute("SELECT id, (args->>'user_id')::int FROM postbox.outbox ORDER BY id")).fetchall()
    assert rows == list(zip(ids, range(500), strict=True))


def test_pipelined_enqueue_commits_and_rolls_back_with_the_business_row(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    conn.execute("CREATE TABLE biz (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)")
    conn.commit()
    ids: list[int] = []
    with conn.pipeline() as pipe:
        for i in range(40):  # more than one block of drawn ids
            with conn.transaction():
                biz = conn.execute("INSERT INTO biz (note) VALUES (%s) RETURNING id", (f"o{i}",)).fetchone()
                assert biz is not None
                ids.append(postbox.enqueue(conn, "send_welcome", {"user_id": biz[0]}, priority=8))
        with pytest.raises(RuntimeError), conn.transaction():
            lost = postbox.enqueue(conn, tasks_core.noop)
            raise RuntimeError("business failure")
        pipe.sync()
    rows = conn.execute(
        "SELECT id, task, (args->>'user_id')::int, priority, state FROM postbox.outbox ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == sorted(ids) and len(set(ids)) == 40 and lost not in ids
    assert [(r[1], r[2], r[3], r[4]) for r in sorted(rows, key=lambda r: ids.index(r[0]))] == [
        ("send_welcome", n, 8, "pending") for n in range(1, 41)
    ]
    # a plain enqueue afterwards draws from the sequence as before: no id is handed out twice
    with conn.transaction():
        assert postbox.enqueue(conn, tasks_core.noop) not in [*ids, lost]


def test_pipelined_enqueue_with_a_dedup_key_waits_for_its_answer(conn: psycopg.Connection[Any]) -> None:
    with conn.pipeline(), conn.transaction():
        first = postbox.enqueue(conn, tasks_core.noop, dedup_key="k")
        again = postbox.enqueue(conn, tasks_core.noop, dedup_key="k")
    assert first == again
    assert count(conn) == 1


def test_an_error_later_in_the_pipeline_takes_the_enqueued_job_with_it(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE biz (id int PRIMARY KEY)")
    conn.commit()
    with pytest.raises(psycopg.errors.UniqueViolation), conn.pipeline(), conn.transaction():
        postbox.enqueue(conn, tasks_core.noop)
        conn.execute("INSERT INTO biz VALUES (1), (1)")  # fails at the sync, after the enqueue was sent
    assert count(conn) == 0


async def test_pipelined_enqueue_async(aconn: psycopg.AsyncConnection[Any]) -> None:
    async with aconn.pipeline(), aconn.transaction():
        ids = [await postbox.enqueue_async(aconn, "send_welcome", {"user_id": i}) for i in range(3)]
    rows = await (await aconn.execute("SELECT id, (args->>'user_id')::int FROM postbox.outbox ORDER BY id")).fetchall()
    assert rows == list(zip(ids, range(3), strict=True))
