"""Stagedoor's own tables, in their own ``stagedoor`` schema: the demo's migration step.

postbox's migrations (``postbox migrate``) create postbox's schema only; the
example application migrates itself, as any application using postbox does.
The DDL is idempotent (``IF NOT EXISTS``) and runs under an advisory lock, so
two processes starting at once create it once: ``stagedoor migrate``,
the demo and the test harness run it.
"""

from __future__ import annotations

from typing import LiteralString

import psycopg

SCHEMA = "stagedoor"
MIGRATE_LOCK = 0x7374616765646F72  # "stagedor": one creator at a time

LOCK: LiteralString = "SELECT pg_advisory_xact_lock(%(key)s)"

# seats_reserved is taken by the order transaction (check and reserve in one
# UPDATE); seats_sold is counted by the update_sales_counter job.
CREATE: LiteralString = """
CREATE SCHEMA IF NOT EXISTS stagedoor;

CREATE TABLE IF NOT EXISTS stagedoor.events (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    capacity       integer     NOT NULL CHECK (capacity >= 0),
    seats_reserved integer     NOT NULL DEFAULT 0 CHECK (seats_reserved >= 0 AND seats_reserved <= capacity),
    seats_sold     integer     NOT NULL DEFAULT 0 CHECK (seats_sold >= 0),
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS stagedoor.orders (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    public_id  text        NOT NULL UNIQUE,
    event_id   bigint      NOT NULL REFERENCES stagedoor.events (id),
    seats      integer     NOT NULL CHECK (seats >= 1),
    email      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS orders_event ON stagedoor.orders (event_id);

-- One row per seat; pdf_key stays NULL until the order's PDF is stored.
CREATE TABLE IF NOT EXISTS stagedoor.tickets (
    order_id bigint  NOT NULL REFERENCES stagedoor.orders (id) ON DELETE CASCADE,
    seat     integer NOT NULL CHECK (seat >= 1),
    pdf_key  text,
    PRIMARY KEY (order_id, seat)
);

-- The effect "an email of this kind went out for this order", made unique.
CREATE TABLE IF NOT EXISTS stagedoor.email_sends (
    order_id   bigint      NOT NULL REFERENCES stagedoor.orders (id) ON DELETE CASCADE,
    kind       text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    claimed_by text,
    sent_at    timestamptz,
    provider_message_id text,
    UNIQUE (order_id, kind)
);
"""

DROP: LiteralString = "DROP SCHEMA IF EXISTS stagedoor CASCADE"


def migrate(database_url: str) -> None:
    """Create Stagedoor's schema and tables if they are missing."""
    with psycopg.connect(database_url) as conn, conn.transaction():
        conn.execute(LOCK, {"key": MIGRATE_LOCK})
        conn.execute(CREATE)


def drop(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(DROP)
