"""Placing an order: validate, reserve seats, write the order and its tickets, enqueue its jobs — one transaction.

The two jobs go into the outbox in the caller's transaction, so they exist if
and only if the order does: a refused order leaves no order, no ticket and no job.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox.producer import enqueue_async
from postbox_examples.stagedoor import sql
from postbox_examples.stagedoor.errors import (
    InvalidEmailError,
    InvalidOrderError,
    NotEnoughSeatsError,
    UnknownEventError,
)
from postbox_examples.stagedoor.tasks import render_tickets, update_sales_counter

MAX_SEATS_PER_ORDER = 20
MAX_CAPACITY = 1_000_000
MAX_EMAIL = 254
# Deliberately modest: one @, a dot in the domain, no spaces. Real validation is the email sent.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
EMAIL_RE = re.compile(rf"^[^@\s]{{1,64}}@{_LABEL}(?:\.{_LABEL})+$")
PUBLIC_ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


@dataclass(frozen=True)
class Event:
    id: int
    name: str
    capacity: int
    seats_reserved: int
    seats_sold: int
    created_at: datetime


@dataclass(frozen=True)
class PlacedOrder:
    id: int
    public_id: str
    event_id: int
    seats: int
    email: str
    seat_numbers: list[int]
    job_ids: list[int]
    created_at: datetime


def new_public_id(choice: Callable[[str], str] = secrets.choice) -> str:
    """``SD-`` and ten unambiguous characters (no 0/O, 1/I): what the buyer sees."""
    return "SD-" + "".join(choice(PUBLIC_ID_ALPHABET) for _ in range(10))


def check_event(name: Any, capacity: Any) -> tuple[str, int]:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidOrderError("event name must be a non-empty string of at most 200 characters", field="name")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity <= MAX_CAPACITY:
        raise InvalidOrderError(f"capacity must be an integer 0-{MAX_CAPACITY}", field="capacity")
    return name.strip(), capacity


def check_order(event_id: Any, seats: Any, email: Any) -> tuple[int, int, str]:
    """Pure validation of an order's input; raises a typed :class:`~postbox_examples.stagedoor.errors.OrderError`."""
    if isinstance(event_id, bool) or not isinstance(event_id, int) or event_id < 1:
        raise InvalidOrderError("event_id must be a positive integer", field="event_id")
    if isinstance(seats, bool) or not isinstance(seats, int) or not 1 <= seats <= MAX_SEATS_PER_ORDER:
        raise InvalidOrderError(
            f"seats must be an integer 1-{MAX_SEATS_PER_ORDER}", field="seats", details={"max": MAX_SEATS_PER_ORDER}
        )
    if not isinstance(email, str) or len(email) > MAX_EMAIL or not EMAIL_RE.match(email):
        raise InvalidEmailError("email is not a valid address", field="email")
    return event_id, seats, email


async def create_event(conn: AsyncConnection[Any], name: Any, capacity: Any) -> Event:
    clean_name, clean_capacity = check_event(name, capacity)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.INSERT_EVENT, {"name": clean_name, "capacity": clean_capacity})
        row = await cur.fetchone()
    assert row is not None
    return Event(**row)


async def get_event(conn: AsyncConnection[Any], event_id: int) -> Event | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.SELECT_EVENT, {"id": event_id})
        row = await cur.fetchone()
    return None if row is None else Event(**row)


async def place_order(
    conn: AsyncConnection[Any],
    event_id: Any,
    seats: Any,
    email: Any,
    *,
    request_id: str | None = None,
    public_id: str | None = None,
) -> PlacedOrder:
    """Reserve seats, write the order, its tickets and its two jobs, all in one transaction.

    Runs in a transaction block of its own (a savepoint when the caller has one
    open); on any error everything it wrote is rolled back.
    """
    event_id, seats, email = check_order(event_id, seats, email)
    headers = {"request_id": request_id} if request_id else None
    async with conn.transaction(), conn.cursor() as cur:
        await cur.execute(sql.RESERVE_SEATS, {"event_id": event_id, "seats": seats})
        reserved = await cur.fetchone()
        if reserved is None:
            await cur.execute(sql.SELECT_EVENT_SEATS, {"event_id": event_id})
            found = await cur.fetchone()
            if found is None:
                raise UnknownEventError(f"no event {event_id}", field="event_id", details={"event_id": event_id})
            capacity, taken = found
            raise NotEnoughSeatsError(
                f"event {event_id} has {capacity - taken} seats left, {seats} asked",
                field="seats",
                details={"event_id": event_id, "available": capacity - taken, "requested": seats},
            )
        first_seat = int(reserved[0])
        pid = public_id or new_public_id()
        await cur.execute(sql.INSERT_ORDER, {"public_id": pid, "event_id": event_id, "seats": seats, "email": email})
        inserted = await cur.fetchone()
        assert inserted is not None
        order_id, created_at = int(inserted[0]), inserted[1]
        await cur.execute(sql.INSERT_TICKETS, {"order_id": order_id, "first_seat": first_seat, "seats": seats})
        job_ids: list[int] = [
            await enqueue_async(conn, render_tickets, {"order_id": order_id}, headers=headers),
            await enqueue_async(conn, update_sales_counter, {"order_id": order_id}, headers=headers),
        ]
    return PlacedOrder(
        id=order_id,
        public_id=pid,
        event_id=event_id,
        seats=seats,
        email=email,
        seat_numbers=list(range(first_seat, first_seat + seats)),
        job_ids=job_ids,
        created_at=created_at,
    )
