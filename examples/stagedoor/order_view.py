"""An order as its jobs see it: buyer, event, seats and where its PDF is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox_examples.stagedoor import sql


@dataclass(frozen=True)
class OrderView:
    id: int
    public_id: str
    seats: int
    email: str
    created_at: datetime
    event_id: int
    event_name: str
    seat_numbers: list[int]
    rendered: int  # tickets with a pdf_key
    pdf_key: str | None

    @property
    def blob_key(self) -> str:
        """Where this order's PDF is stored: derived from the order, the same on every run."""
        return f"tickets/{self.public_id}.pdf"


async def load_order(conn: AsyncConnection[Any], order_id: int) -> OrderView | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.SELECT_ORDER, {"order_id": order_id})
        row = await cur.fetchone()
    return None if row is None else OrderView(**row)
