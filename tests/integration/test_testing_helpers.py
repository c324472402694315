"""postbox.testing in an application's own tests: assert what was enqueued, run the jobs inline.

Everything happens in the test's one open transaction; rolling it back leaves nothing.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from postbox import PermanentError, RetryLater, enqueue_async, task
from postbox.registry import Registry
from postbox.testing import (
    assert_enqueued,
    assert_enqueued_async,
    assert_not_enqueued_async,
    enqueued_async,
    run_enqueued,
)

shop = Registry()  # a user's tasks, kept out of the process-wide registry of the other tests


@task(registry=shop, queue="payments", priority=8)
async def charge(ctx: Any, order_id: int, amount: int) -> None:
    async with ctx.transaction() as conn:
        await conn.execute("INSERT INTO charges (order_id, amount) VALUES (%s, %s)", (order_id, amount))
        await ctx.enqueue("send_receipt", {"order_id": order_id})


@task(registry=shop, queue="mail", keep_result=True)
async def send_receipt(ctx: Any, order_id: int) -> str:
    async with ctx.transaction() as conn:
        await conn.execute("INSERT INTO receipts (order_id) VALUES (%s)", (order_id,))
    return f"receipt-{order_id}"


@task(registry=shop, max_attempts=3)
async def flaky(ctx: Any) -> int:
    if ctx.attempt < 3:
        raise RetryLater(600, f"not yet ({ctx.attempt})")
    return ctx.attempt


@task(registry=shop, max_attempts=5)
async def broken(ctx: Any) -> None:
    raise PermanentError("the card was declined")


async def place_order(conn: psycopg.AsyncConnection[Any], order_id: int, amount: int, *, forget: bool = False) -> None:
    """The application's code under test: an order and its charge job in one transaction."""
    await conn.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order_id, amount))
    if not forget:
        await enqueue_async(conn, "charge", {"order_id": order_id, "amount": amount}, registry=shop)


@pytest.fixture
async def tx(aconn: psycopg.AsyncConnection[Any]) -> Any:
    for ddl in (
        "orders (id int PRIMARY KEY, amount int)",
        "charges (order_id int, amount int)",
        "receipts (order_id int)",
    ):
        await aconn.execute(f"CREATE TABLE {ddl}")  # type: ignore[arg-type]
    await aconn.commit()
    yield aconn
    await aconn.rollback()


async def test_assert_enqueued_sees_the_open_transaction(tx: psycopg.AsyncConnection[Any]) -> None:
    await place_order(tx, 1, 42)
    [job] = await assert_enqueued_async(tx, "charge", args={"order_id": 1}, queue="payments", priority=8, count=1)
    assert (job.args, job.state) == ({"order_id": 1, "amount": 42}, "pending")
    await assert_not_enqueued_async(tx, "send_receipt")


async def test_a_missing_enqueue_fails_with_what_was_enqueued(tx: psycopg.AsyncConnection[Any]) -> None:
    await place_order(tx, 1, 42)
    await place_order(tx, 2, 7, forget=True)  # the bug: order 2 has no charge
    with pytest.raises(AssertionError) as failure:
        await assert_enqueued_async(tx, charge, args={"order_id": 2})
    assert str(failure.value) == (
        "expected at least one job(s) charge args={'order_id': 2}, found 0; enqueued:\n"
        "  #1 charge queue=payments priority=8 args={'amount': 42, 'order_id': 1} state=pending"
    )


async def test_run_inline_with_follow_ups_retries_and_dead_letters(tx: psycopg.AsyncConnection[Any]) -> None:
    await place_order(tx, 1, 42)
    flaky_id = await enqueue_async(tx, flaky, registry=shop)
    broken_id = await enqueue_async(tx, broken, registry=shop)
    runs = await run_enqueued(tx, registry=shop)
    summary = [(run.task, run.attempt, run.state, run.result, run.error_class) for run in runs]
    assert summary == [
        ("charge", 1, "succeeded", None, None),
        ("flaky", 1, "retrying", None, "RetryLater"),
        ("broken", 1, "dead", None, "PermanentError"),
        ("flaky", 2, "retrying", None, "RetryLater"),  # round 2, in id order: the retry at once,
        ("send_receipt", 1, "succeeded", "receipt-1", None),  # then charge's follow-up
        ("flaky", 3, "succeeded", None, None),
    ]
    assert runs[2].error == "the card was declined"
    cur = await tx.execute("SELECT (SELECT count(*) FROM charges), (SELECT count(*) FROM receipts)")
    assert await cur.fetchone() == (1, 1)
    states = {job.id: (job.state, job.attempts) for job in await enqueued_async(tx)}
    assert states[flaky_id] == ("succeeded", 3) and states[broken_id] == ("dead", 1)
    cur = await tx.execute("SELECT count(*) FROM postbox.processed_jobs")
    assert await cur.fetchone() == (2,)  # charge and send_receipt committed their effects once each
    assert await run_enqueued(tx, registry=shop) == []  # nothing left to run


async def test_effects_happen_once_even_if_a_job_runs_twice(tx: psycopg.AsyncConnection[Any]) -> None:
    await place_order(tx, 1, 42)
    await run_enqueued(tx, charge, registry=shop)
    # Put the job back as if redelivered: its processed_jobs row absorbs the second run.
    await tx.execute("UPDATE postbox.outbox SET state = 'queued' WHERE task = 'charge'")
    [again] = await run_enqueued(tx, charge, registry=shop)
    assert (again.attempt, again.state) == (2, "succeeded")
    cur = await tx.execute("SELECT count(*) FROM charges")
    assert await cur.fetchone() == (1,)


async def test_isolation_the_rollback_leaves_nothing(aconn: psycopg.AsyncConnection[Any]) -> None:
    await aconn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int)")
    await aconn.execute("CREATE TABLE charges (order_id int, amount int)")
    await aconn.execute("CREATE TABLE receipts (order_id int)")
    await place_order(aconn, 1, 42)
    await run_enqueued(aconn, registry=shop)
    await aconn.rollback()
    cur = await aconn.execute(
        "SELECT (SELECT count(*) FROM postbox.outbox), (SELECT count(*) FROM postbox.processed_jobs)"
    )
    assert await cur.fetchone() == (0, 0)


def test_sync_assertions(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT postbox.enqueue('nightly', '{\"day\": \"mon\"}', queue => 'reports')")
    assert [j.queue for j in assert_enqueued(conn, "nightly", args={"day": "mon"})] == ["reports"]
    with pytest.raises(AssertionError, match="expected 2 job"):
        assert_enqueued(conn, "nightly", count=2)
