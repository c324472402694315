"""The four Stagedoor handlers, run twice (at once) for one order: one PDF, one email, one increment.

Handlers run through a real-database ctx (tests/harness/stagedoor_ctx.py); the
email is counted at the real provider process, never in our own tables.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from psycopg import AsyncConnection

from postbox.errors import AlreadyProcessed, PermanentError, RetryLater
from postbox.settings import Settings
from postbox_examples.settings import ExampleSettings
from postbox_examples.stagedoor import services as stagedoor_services
from postbox_examples.stagedoor import sql as stagedoor_sql
from postbox_examples.stagedoor import tasks
from postbox_examples.stagedoor.mail import MailClient, Message, ProviderError
from postbox_examples.stagedoor.orders import PlacedOrder, create_event, place_order
from postbox_examples.stagedoor.services import Services
from tests.harness.provider import ProviderProcess
from tests.harness.stagedoor_ctx import DbJobContext


class Crash(BaseException):
    """Stands for the process dying: no except-Exception block runs."""


class CrashAfterSend(MailClient):
    async def send(self, message: Message, *, idempotency_key: str, request_id: str | None = None) -> dict[str, Any]:
        await super().send(message, idempotency_key=idempotency_key, request_id=request_id)
        raise Crash("died after the provider accepted the message, before sent_at")


@pytest.fixture
def provider_args() -> list[str]:
    return []


@pytest.fixture
def provider(database_url: str, provider_args: list[str]) -> Iterator[ProviderProcess]:
    process = ProviderProcess(database_url, provider_args)
    try:
        yield process.start()
    finally:
        process.stop()


@pytest.fixture
async def svc(settings: Settings, provider: ProviderProcess, tmp_path: Any) -> AsyncIterator[Services]:
    example = ExampleSettings(provider_url=provider.url, blob_dir=str(tmp_path / "blobs"))
    opened = await Services.open(settings, example)
    previous = stagedoor_services.install(opened)
    try:
        yield opened
    finally:
        stagedoor_services.install(previous)
        await opened.close()


@pytest.fixture
async def order(aconn: AsyncConnection[Any]) -> PlacedOrder:
    event = await create_event(aconn, "Die Zauberflöte", 100)
    await place_order(aconn, event.id, 1, "first@example.org")  # another order, so ids differ from seats
    return await place_order(aconn, event.id, 3, "buyer@example.org", request_id="req-42")


def ctx(database_url: str, job_id: int, **kw: Any) -> DbJobContext:
    return DbJobContext(database_url, job_id, **kw)


async def fetch(conn: AsyncConnection[Any], query: Any, *params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params or None)
    return await cur.fetchall()


async def db_now(conn: AsyncConnection[Any]) -> datetime:
    rows = await fetch(conn, "SELECT now()")
    await conn.rollback()  # do not keep now() pinned to an open transaction
    return rows[0][0]  # type: ignore[no-any-return]


async def send_jobs(conn: AsyncConnection[Any], order_id: int) -> list[tuple[Any, ...]]:
    return await fetch(
        conn,
        "SELECT id, args, headers FROM postbox.outbox WHERE task = 'send_tickets' AND args->>'order_id' = %s",
        str(order_id),
    )


# --- render_tickets: check state first, conditional UPDATE -------------------------------


async def test_render_twice_at_once_one_pdf_one_email_job(
    database_url: str, aconn: AsyncConnection[Any], svc: Services, order: PlacedOrder, monkeypatch: Any
) -> None:
    # Both runs pass the "already rendered?" check before either stores its key:
    # the conditional UPDATE alone must decide who queues the email.
    both_rendered = threading.Barrier(2, timeout=10)
    real_render = tasks.render

    def render_in_step(doc: Any) -> bytes:
        data = real_render(doc)
        both_rendered.wait()
        return data

    monkeypatch.setattr(tasks, "render", render_in_step)
    render_job, _ = order.job_ids
    duplicate_job = render_job + 1000  # a duplicate job for the same order (e.g. enqueued twice)
    results = await asyncio.gather(
        tasks.render_tickets(ctx(database_url, render_job, headers={"request_id": "req-42"}), order_id=order.id),
        tasks.render_tickets(ctx(database_url, duplicate_job, headers={"request_id": "req-42"}), order_id=order.id),
        return_exceptions=True,
    )
    assert results == [None, None]
    # Both committed their run (both passed the check), and exactly one queued the email.
    assert await fetch(aconn, "SELECT outbox_id FROM postbox.processed_jobs ORDER BY 1") == [
        (render_job,),
        (duplicate_job,),
    ]
    jobs = await send_jobs(aconn, order.id)
    assert [(args, headers) for _, args, headers in jobs] == [({"order_id": order.id}, {"request_id": "req-42"})]
    key = f"tickets/{order.public_id}.pdf"
    assert await fetch(
        aconn, "SELECT seat, pdf_key FROM stagedoor.tickets WHERE order_id = %s ORDER BY seat", order.id
    ) == [(seat, key) for seat in order.seat_numbers]
    assert svc.blobs.keys() == [key]
    pdf = svc.blobs.get(key)
    assert pdf.startswith(b"%PDF-") and pdf.count(b"/Type /Page\n") == 3
    for seat in order.seat_numbers:
        assert f"Seat {seat}".encode() in pdf
    assert pdf.count(f"Order {order.public_id}".encode()) == 3

    # A later delivery of the same order checks state first and stops there.
    late_job = render_job + 2000
    await tasks.render_tickets(ctx(database_url, late_job), order_id=order.id)
    assert (late_job,) not in await fetch(aconn, "SELECT outbox_id FROM postbox.processed_jobs")
    assert len(await send_jobs(aconn, order.id)) == 1


async def test_render_same_job_twice_at_once(
    database_url: str, aconn: AsyncConnection[Any], svc: Services, order: PlacedOrder
) -> None:
    render_job, _ = order.job_ids
    results = await asyncio.gather(
        tasks.render_tickets(ctx(database_url, render_job), order_id=order.id),
        tasks.render_tickets(ctx(database_url, render_job), order_id=order.id),
        return_exceptions=True,
    )
    assert results.count(None) >= 1
    assert all(r is None or isinstance(r, AlreadyProcessed) for r in results)
    assert await fetch(aconn, "SELECT outbox_id FROM postbox.processed_jobs WHERE outbox_id = %s", render_job) == [
        (render_job,)
    ]
    assert len(await send_jobs(aconn, order.id)) == 1
    assert svc.blobs.keys() == [f"tickets/{order.public_id}.pdf"]


async def test_render_unknown_order_is_permanent(database_url: str, svc: Services) -> None:
    with pytest.raises(PermanentError):
        await tasks.render_tickets(ctx(database_url, 1), order_id=987654)
    assert svc.blobs.keys() == []


# --- send_tickets: unique claim + provider idempotency key -------------------------------------


async def rendered(database_url: str, aconn: AsyncConnection[Any], order: PlacedOrder) -> int:
    await tasks.render_tickets(ctx(database_url, order.job_ids[0]), order_id=order.id)
    ((send_job, _, _),) = await send_jobs(aconn, order.id)
    return int(send_job)


async def test_send_twice_at_once_one_email(
    database_url: str, aconn: AsyncConnection[Any], svc: Services, provider: ProviderProcess, order: PlacedOrder
) -> None:
    send_job = await rendered(database_url, aconn, order)
    results = await asyncio.gather(
        *(tasks.send_tickets(ctx(database_url, send_job, attempt=n + 1), order_id=order.id) for n in range(2)),
        return_exceptions=True,
    )
    assert None in results
    assert all(r is None or (isinstance(r, RetryLater) and r.seconds == 120) for r in results)
    messages = provider.messages()
    assert [(m["idempotency_key"], m["to"], m["replays"]) for m in messages] == [
        (f"tickets-{order.id}", "buyer@example.org", 0)  # the loser never called the provider
    ]
    assert order.public_id in messages[0]["subject"]
    (attachment,) = messages[0]["attachments"]
    assert attachment["sha256"] == hashlib.sha256(svc.blobs.get(f"tickets/{order.public_id}.pdf")).hexdigest()
    rows = await fetch(
        aconn, "SELECT kind, sent_at IS NOT NULL FROM stagedoor.email_sends WHERE order_id = %s", order.id
    )
    assert rows == [("tickets", True)]
    # Any later delivery sees sent_at and is done.
    await tasks.send_tickets(ctx(database_url, send_job, attempt=3), order_id=order.id)
    assert [m["replays"] for m in provider.messages()] == [0]


async def test_crash_between_send_and_sent_at_retry_sends_same_key(
    database_url: str, aconn: AsyncConnection[Any], svc: Services, provider: ProviderProcess, order: PlacedOrder
) -> None:
    send_job = await rendered(database_url, aconn, order)
    real_mail = svc.mail
    svc.mail = CrashAfterSend(provider.url, 5.0)
    try:
        with pytest.raises(Crash):
            await tasks.send_tickets(ctx(database_url, send_job, attempt=1), order_id=order.id)
    finally:
        await svc.mail.aclose()
        svc.mail = real_mail
    assert [(m["idempotency_key"], m["replays"]) for m in provider.messages()] == [(f"tickets-{order.id}", 0)]
    assert await fetch(aconn, "SELECT sent_at FROM stagedoor.email_sends WHERE order_id = %s", order.id) == [(None,)]

    # The redelivery finds the dead run's claim still fresh: it must not send, it comes back later.
    with pytest.raises(RetryLater) as retry:
        await tasks.send_tickets(ctx(database_url, send_job, attempt=2), order_id=order.id)
    assert retry.value.seconds == 120

    # Two minutes later (time injected, not slept) the claim is stale and is taken over;
    # the retry sends with the same key and the provider delivers nothing new.
    later = await db_now(aconn) + timedelta(minutes=2, seconds=1)
    svc.now = lambda: later
    await tasks.send_tickets(ctx(database_url, send_job, attempt=3), order_id=order.id)
    assert [(m["idempotency_key"], m["replays"]) for m in provider.messages()] == [(f"tickets-{order.id}", 1)]
    rows = await fetch(aconn, "SELECT sent_at, claimed_by FROM stagedoor.email_sends WHERE order_id = %s", order.id)
    assert rows == [(later, f"worker-testctx0/{send_job}/3")]


async def test_stale_claim_reclaimed_after_two_minutes_not_before(
    aconn: AsyncConnection[Any], svc: Services, order: PlacedOrder
) -> None:
    t0 = await db_now(aconn)

    async def claim(at: datetime, who: str) -> bool:
        params = {"order_id": order.id, "kind": "tickets", "now": at, "claim_ttl": 120.0, "claimed_by": who}
        async with svc.pool.connection() as conn:
            return await (await conn.execute(stagedoor_sql.CLAIM_SEND, params)).fetchone() is not None

    assert await claim(t0, "a") is True
    assert await claim(t0 + timedelta(seconds=1), "b") is False
    assert await claim(t0 + timedelta(seconds=119), "b") is False
    assert await claim(t0 + timedelta(seconds=121), "b") is True  # a's claim went stale: b takes over
    assert await claim(t0 + timedelta(seconds=200), "c") is False  # b's claim is fresh again
    async with svc.pool.connection() as conn:
        await conn.execute(
            stagedoor_sql.MARK_SENT,
            {"order_id": order.id, "kind": "tickets", "now": t0 + timedelta(seconds=130), "message_id": "m"},
        )
    assert await claim(t0 + timedelta(days=1), "d") is False  # a sent email is never claimed again
    rows = await fetch(aconn, "SELECT claimed_at, claimed_by FROM stagedoor.email_sends WHERE order_id = %s", order.id)
    assert rows == [(t0 + timedelta(seconds=121), "b")]


@pytest.mark.parametrize("provider_args", [["--fail-after-delivery", "1.0"]])
async def test_provider_error_releases_claim_and_retry_is_a_replay(
    database_url: str, aconn: AsyncConnection[Any], svc: Services, provider: ProviderProcess, order: PlacedOrder
) -> None:
    send_job = await rendered(database_url, aconn, order)
    with pytest.raises(ProviderError):
        await tasks.send_tickets(ctx(database_url, send_job, attempt=1), order_id=order.id)
    released = "SELECT claimed_at = 'epoch', claimed_by, sent_at FROM stagedoor.email_sends WHERE order_id = %s"
    assert await fetch(aconn, released, order.id) == [(True, None, None)]
    # No two-minute wait: the released claim is taken at once, the provider replays its first answer.
    await tasks.send_tickets(ctx(database_url, send_job, attempt=2), order_id=order.id)
    assert [(m["idempotency_key"], m["replays"]) for m in provider.messages()] == [(f"tickets-{order.id}", 1)]
    sent = await fetch(aconn, "SELECT sent_at IS NOT NULL FROM stagedoor.email_sends WHERE order_id = %s", order.id)
    assert sent == [(True,)]


async def test_send_before_render_is_permanent(database_url: str, svc: Services, order: PlacedOrder) -> None:
    with pytest.raises(PermanentError):
        await tasks.send_tickets(ctx(database_url, 77), order_id=order.id)


# --- update_sales_counter: the job id as the key ------------------------------------------


async def test_counter_twice_at_once_one_increment(
    database_url: str, aconn: AsyncConnection[Any], svc: Services, order: PlacedOrder
) -> None:
    _, counter_job = order.job_ids
    results = await asyncio.gather(
        *(tasks.update_sales_counter(ctx(database_url, counter_job), order_id=order.id) for _ in range(2)),
        return_exceptions=True,
    )
    assert sorted(type(r).__name__ for r in results) == ["AlreadyProcessed", "NoneType"]
    with pytest.raises(AlreadyProcessed):
        await tasks.update_sales_counter(ctx(database_url, counter_job), order_id=order.id)
    rows = await fetch(aconn, "SELECT seats_sold FROM stagedoor.events WHERE id = %s", order.event_id)
    assert rows == [(3,)]


async def test_counter_for_unknown_order_commits_nothing(
    database_url: str, aconn: AsyncConnection[Any], svc: Services
) -> None:
    with pytest.raises(PermanentError):
        await tasks.update_sales_counter(ctx(database_url, 5), order_id=424242)
    assert await fetch(aconn, "SELECT count(*) FROM postbox.processed_jobs") == [(0,)]
