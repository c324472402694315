"""Stagedoor, the worked example: events, orders, tickets and email sends.

Revision ID: 0002_stagedoor
Revises: 0001_outbox
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0002_stagedoor"
down_revision = "0001_outbox"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- seats_reserved is taken by the order transaction (check and reserve in one
-- UPDATE); seats_sold is counted by the update_sales_counter job.
CREATE TABLE events (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    capacity       integer     NOT NULL CHECK (capacity >= 0),
    seats_reserved integer     NOT NULL DEFAULT 0 CHECK (seats_reserved >= 0 AND seats_reserved <= capacity),
    seats_sold     integer     NOT NULL DEFAULT 0 CHECK (seats_sold >= 0),
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orders (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    public_id  text        NOT NULL UNIQUE,
    event_id   bigint      NOT NULL REFERENCES events (id),
    seats      integer     NOT NULL CHECK (seats >= 1),
    email      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_event ON orders (event_id);

-- One row per seat; pdf_key stays NULL until the order's PDF is stored.
CREATE TABLE tickets (
    order_id bigint  NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    seat     integer NOT NULL CHECK (seat >= 1),
    pdf_key  text,
    PRIMARY KEY (order_id, seat)
);

-- The effect "an email of this kind went out for this order", made unique.
CREATE TABLE email_sends (
    order_id   bigint      NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    kind       text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    claimed_by text,
    sent_at    timestamptz,
    provider_message_id text,
    UNIQUE (order_id, kind)
);
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS email_sends;
DROP TABLE IF EXISTS tickets;
DROP TABLE IF EXISTS orders;
DROP TABLE IF EXISTS events;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
