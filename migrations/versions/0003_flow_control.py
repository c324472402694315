"""Flow control: limits declared and overridden, concurrency slots, rate cells.

``limits`` holds, per queue and per task, the limits declared in code (published
by workers when they start) and an operator's override. ``limit_slots`` are
concurrency slots: one row per (key, job), counted only while its job runs under
a live claim, so a crashed worker's slots come back when its leases expire.
``limit_rates`` holds two GCRA cells (theoretical arrival times) per rate key: one
hands out tokens (reservations), one spaces the starts themselves.
A job held back by a limit keeps what it waits for in ``outbox.flow_wait`` (the
concurrency key; woken when a slot of it is released) or
``outbox.flow_reserved_at`` (its rate reservation). docs/flow-control.md.

Revision ID: 0003_flow_control
Revises: 0002_schedules
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0003_flow_control"
down_revision = "0002_schedules"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE {schema}.limits (
    scope        text        NOT NULL CHECK (scope IN ('queue', 'task')),
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    declared     jsonb,                  -- from code: {{concurrency, rate, partition_by}} (NULL: none)
    declared_by  text,
    declared_at  timestamptz,
    override     jsonb,                  -- an operator's: {{concurrency?, rate?}}; a key present wins
    override_by  text,
    override_at  timestamptz,
    PRIMARY KEY (scope, name)
);

CREATE TABLE {schema}.limit_slots (
    key       text        NOT NULL,
    job_id    bigint      NOT NULL,
    attempt   integer     NOT NULL,
    taken_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, job_id)
);
CREATE INDEX limit_slots_job ON {schema}.limit_slots (job_id);

CREATE TABLE {schema}.limit_rates (
    key        text        PRIMARY KEY,
    tat        timestamptz NOT NULL,   -- GCRA cell of tokens: when the next reservation falls
    start_tat  timestamptz NOT NULL    -- GCRA cell of starts: when the next start may come
);

ALTER TABLE {schema}.outbox
    ADD COLUMN flow_wait        text,        -- held back: the concurrency key it waits on
    ADD COLUMN flow_reserved_at timestamptz; -- held back: its rate reservation
-- Jobs parked on a full key, oldest first within priority: what a released slot wakes.
CREATE INDEX outbox_flow_wait ON {schema}.outbox (flow_wait, priority DESC, id)
    WHERE flow_wait IS NOT NULL AND state = 'pending';
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS {schema}.outbox_flow_wait;
ALTER TABLE {schema}.outbox DROP COLUMN IF EXISTS flow_wait, DROP COLUMN IF EXISTS flow_reserved_at;
DROP TABLE IF EXISTS {schema}.limit_rates, {schema}.limit_slots, {schema}.limits;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
