"""Stagedoor's jobs: four handlers, one idempotency technique each (DESIGN.md §6).

Workers load this module (``POSTBOX_TASKS=postbox_examples.stagedoor.tasks``).  Delivery is
at least once — a job may run twice, even at the same time — and each handler
makes its effect happen once anyway:

- ``render_tickets``: check state first, a conditional UPDATE decides the winner;
- ``send_tickets``: a unique claim row on the effect, plus
- the provider's idempotency key ``tickets-<order_id>`` on every attempt;
- ``update_sales_counter``: the job id as the key (``ctx.transaction()``).

See docs/idempotent-handlers.md for why each is needed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from postbox.context import JobContext
from postbox.errors import PermanentError, RetryLater
from postbox.registry import task
from postbox_examples.stagedoor import services, sql
from postbox_examples.stagedoor.mail import Attachment, Message, ProviderError, tickets_key
from postbox_examples.stagedoor.order_view import OrderView, load_order
from postbox_examples.stagedoor.pdf import TicketDocument, render

TICKETS_EMAIL = "tickets"


async def _order(svc: services.Services, order_id: int) -> OrderView:
    async with svc.pool.connection() as conn:
        order = await load_order(conn, order_id)
    if order is None:
        raise PermanentError(f"order {order_id} does not exist")
    return order


def _forwarded(ctx: JobContext) -> dict[str, Any]:
    request_id = ctx.headers.get("request_id")
    return {"request_id": request_id} if request_id else {}


@task(queue="stagedoor", priority=5, max_attempts=10, timeout=60)
async def render_tickets(ctx: JobContext, order_id: int) -> None:
    """Technique 1, check state first: render once, and queue the email exactly once."""
    svc = await services.current()
    order = await _order(svc, order_id)
    if order.rendered:
        ctx.log.info("tickets already rendered", extra={"order_id": order_id})
        return
    # No transaction is open while we render and write: nothing is held for seconds.
    doc = TicketDocument(order.public_id, order.event_name, order.email, order.seat_numbers, order.created_at)
    data = await asyncio.to_thread(render, doc)
    await asyncio.to_thread(svc.blobs.put, order.blob_key, data)  # same key every run: a rewrite is harmless
    async with ctx.transaction() as conn:
        cur = await conn.execute(sql.SET_PDF_KEY, {"order_id": order_id, "pdf_key": order.blob_key})
        if cur.rowcount > 0:
            # Only the run whose UPDATE matched gets here, and its enqueue commits with the key.
            await ctx.enqueue(send_tickets, {"order_id": order_id}, headers=_forwarded(ctx))


# The provider allows 50 sends a second (across every worker): the flow-control rate
# limit holds the rest back, unclaimed, until their turn (docs/flow-control.md).
@task(queue="mail", priority=7, max_attempts=10, timeout=60, rate="50/s")
async def send_tickets(ctx: JobContext, order_id: int) -> None:
    """Techniques 2 and 3: a unique claim on the send, and the provider's idempotency key."""
    svc = await services.current()
    order = await _order(svc, order_id)
    if order.pdf_key is None:
        raise PermanentError(f"order {order_id} has no rendered tickets")
    claimant = f"{ctx.worker_id}/{ctx.job_id}/{ctx.attempt}"
    params: dict[str, Any] = {
        "order_id": order_id,
        "kind": TICKETS_EMAIL,
        "now": svc.now(),
        "claim_ttl": svc.claim_ttl,
        "claimed_by": claimant,
    }
    async with svc.pool.connection() as conn:
        claimed = await (await conn.execute(sql.CLAIM_SEND, params)).fetchone()
        if claimed is None:
            existing = await (await conn.execute(sql.SELECT_SEND, params)).fetchone()
            if existing is not None and existing[2] is not None:
                ctx.log.info("tickets email already sent", extra={"order_id": order_id})
                return
            # Another run holds a fresh claim: it is sending right now, or it died
            # mid-send. Come back once that claim can have gone stale.
            raise RetryLater(svc.claim_ttl, "another run holds the send claim")
    pdf_bytes = await asyncio.to_thread(svc.blobs.get, order.pdf_key)
    message = Message(
        to=order.email,
        subject=f"Your tickets for {order.event_name} ({order.public_id})",
        text=(
            f"Order {order.public_id}: {order.seats} seat(s), "
            f"seat{'s' if order.seats > 1 else ''} {', '.join(map(str, order.seat_numbers))}.\n"
            "Your tickets are attached, one page per seat."
        ),
        attachments=(Attachment(f"{order.public_id}.pdf", pdf_bytes),),
    )
    try:
        answer = await svc.mail.send(
            message, idempotency_key=tickets_key(order_id), request_id=ctx.headers.get("request_id")
        )
    except (ProviderError, PermanentError):
        # The provider answered (or timed out) and we know we recorded nothing:
        # give the claim up so the retry need not wait for it to go stale. Safe
        # even if the message went out: the retry carries the same key.
        async with svc.pool.connection() as conn:
            await conn.execute(sql.RELEASE_CLAIM, params)
        raise
    async with svc.pool.connection() as conn:
        await conn.execute(sql.MARK_SENT, {**params, "message_id": str(answer.get("id", ""))})


@task(queue="stagedoor", priority=3, max_attempts=10, timeout=30)
async def update_sales_counter(ctx: JobContext, order_id: int) -> None:
    """Technique 4, the job id as the key: the increment commits with processed_jobs(job id)."""
    async with ctx.transaction() as conn:
        cur = await conn.execute(sql.ADD_SALES, {"order_id": order_id})
        if cur.rowcount != 1:
            raise PermanentError(f"order {order_id} does not exist")
