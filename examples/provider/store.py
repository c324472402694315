"""The provider's storage: one row per idempotency key, in its own ``provider`` schema.

The UNIQUE key is what makes delivery idempotent, also under concurrency: two
simultaneous first requests race on the same index entry, one inserts, the
other waits for it and finds the row.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import orjson
from psycopg import AsyncConnection
from psycopg.rows import dict_row

SCHEMA_LOCK = 0x70726F7669646572  # advisory lock: two providers starting at once create the schema once

CREATE_SCHEMA: LiteralString = """
CREATE SCHEMA IF NOT EXISTS provider;
CREATE TABLE IF NOT EXISTS provider.messages (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text        NOT NULL UNIQUE,
    request_hash    text        NOT NULL,
    recipient       text        NOT NULL,
    subject         text        NOT NULL,
    body            text        NOT NULL,
    attachments     jsonb       NOT NULL DEFAULT '[]'::jsonb,
    delivered_at    timestamptz NOT NULL DEFAULT now(),
    replays         integer     NOT NULL DEFAULT 0
);
"""

LOCK_SCHEMA: LiteralString = "SELECT pg_advisory_xact_lock(%(key)s)"

DELIVER: LiteralString = """
    INSERT INTO provider.messages (idempotency_key, request_hash, recipient, subject, body, attachments)
    VALUES (%(key)s, %(hash)s, %(to)s, %(subject)s, %(body)s, %(attachments)s)
    ON CONFLICT (idempotency_key) DO NOTHING
 RETURNING id, idempotency_key, request_hash, recipient, subject, delivered_at, replays
"""

REPLAY: LiteralString = """
    UPDATE provider.messages SET replays = replays + 1 WHERE idempotency_key = %(key)s
 RETURNING id, idempotency_key, request_hash, recipient, subject, delivered_at, replays
"""

LIST: LiteralString = """
    SELECT id, idempotency_key, recipient, subject, attachments, delivered_at, replays
      FROM provider.messages ORDER BY id
"""


@dataclass(frozen=True)
class Delivery:
    id: int
    idempotency_key: str
    request_hash: str
    recipient: str
    subject: str
    delivered_at: datetime
    replays: int
    first: bool  # True: delivered by this request; False: answered from the key's record

    def answer(self) -> dict[str, Any]:
        """The answer for this key: the same for the first request and every replay."""
        return {
            "id": f"msg-{self.id}",
            "status": "delivered",
            "idempotency_key": self.idempotency_key,
            "to": self.recipient,
            "subject": self.subject,
            "delivered_at": self.delivered_at.isoformat(),
        }


def request_hash(to: str, subject: str) -> str:
    """What must match for a replay: the same key for another message is a client bug."""
    return hashlib.sha256(orjson.dumps([to, subject])).hexdigest()


async def create_schema(conn: AsyncConnection[Any]) -> None:
    async with conn.transaction():
        await conn.execute(LOCK_SCHEMA, {"key": SCHEMA_LOCK})
        await conn.execute(CREATE_SCHEMA)


async def deliver(
    conn: AsyncConnection[Any], key: str, to: str, subject: str, body: str, attachments: list[dict[str, Any]]
) -> Delivery:
    """Record (deliver) the message unless the key is known; either way return the key's record."""
    params = {
        "key": key,
        "hash": request_hash(to, subject),
        "to": to,
        "subject": subject,
        "body": body,
        "attachments": orjson.dumps(attachments).decode(),
    }
    async with conn.cursor(row_factory=dict_row) as cur:
        while True:
            await cur.execute(DELIVER, params)
            row = await cur.fetchone()
            if row is not None:
                return Delivery(**row, first=True)
            await cur.execute(REPLAY, params)
            row = await cur.fetchone()
            if row is not None:
                return Delivery(**row, first=False)


async def list_messages(conn: AsyncConnection[Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(LIST)
        rows = await cur.fetchall()
    return [
        {
            "id": f"msg-{row['id']}",
            "idempotency_key": row["idempotency_key"],
            "to": row["recipient"],
            "subject": row["subject"],
            "attachments": row["attachments"],
            "delivered_at": row["delivered_at"].isoformat(),
            "replays": row["replays"],
        }
        for row in rows
    ]
