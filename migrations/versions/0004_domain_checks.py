"""Check the outbox's write-once columns when they are written, not on every update.

PostgreSQL evaluates every CHECK constraint of a table on every UPDATE, also
for columns the update leaves alone. Each job's row is updated three times
(the relay's mark, the claim, the outcome), and the checks of four columns
that never change after the INSERT (the queue name's regular expression, the
task name's length, args and headers being JSON objects) cost about 2.4 µs
per updated row: 0.68 -> 0.57 ms for a 50-row claim and 0.84 -> 0.73 ms for
a 50-row outcome (EXPLAIN ANALYZE medians, docs/benchmarks.md). As domains,
the same rules are checked when a value is assigned to the column (INSERT, or
an UPDATE that sets it) and nowhere else. A violation is still SQLSTATE 23514
(check_violation), now naming the domain's constraint.

The column changes are binary compatible (no table rewrite), but PostgreSQL
checks every existing row against the domain under an ACCESS EXCLUSIVE lock
on the outbox: on a large outbox, run it when the system is quiet.

Revision ID: 0004_domain_checks
Revises: 0003_attempts_without_fk
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0004_domain_checks"
down_revision = "0003_attempts_without_fk"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE DOMAIN postbox_queue_name AS text CHECK (VALUE ~ '^[a-z0-9][a-z0-9_-]{0,63}$');
CREATE DOMAIN postbox_task_name AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN postbox_json_object AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');
ALTER TABLE outbox
    DROP CONSTRAINT outbox_queue_check,
    DROP CONSTRAINT outbox_task_check,
    DROP CONSTRAINT outbox_args_check,
    DROP CONSTRAINT outbox_headers_check,
    ALTER COLUMN queue TYPE postbox_queue_name,
    ALTER COLUMN task TYPE postbox_task_name,
    ALTER COLUMN args TYPE postbox_json_object,
    ALTER COLUMN headers TYPE postbox_json_object;
"""

DOWNGRADE = r"""
ALTER TABLE outbox
    ALTER COLUMN queue TYPE text,
    ALTER COLUMN task TYPE text,
    ALTER COLUMN args TYPE jsonb,
    ALTER COLUMN headers TYPE jsonb,
    ADD CONSTRAINT outbox_queue_check CHECK (queue ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    ADD CONSTRAINT outbox_task_check CHECK (length(task) BETWEEN 1 AND 200),
    ADD CONSTRAINT outbox_args_check CHECK (jsonb_typeof(args) = 'object'),
    ADD CONSTRAINT outbox_headers_check CHECK (jsonb_typeof(headers) = 'object');
DROP DOMAIN postbox_queue_name;
DROP DOMAIN postbox_task_name;
DROP DOMAIN postbox_json_object;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
