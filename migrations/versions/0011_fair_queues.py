"""Fair queues (issue 32): a queue declared fair serves its jobs' keys in turn.

``fair_queues`` holds the declarations: the argument whose value is a job's
key (``key_arg``, e.g. ``tenant_id``) and the queue's in-flight window
(``window_size``, NULL: ``POSTBOX_FAIR_WINDOW``). ``outbox.fair_key`` is the
key of a job of a fair queue, written by the relay the first time it selects
the job (so every enqueue path -- Python, REST, SQL ``enqueue()``, COPY --
needs nothing new); rows with a key leave the relay's id-ordered work list
(``outbox_unpublished_id``, rebuilt here with ``fair_key IS NULL``) for
``outbox_fair_waiting``, from which the relay fills the queue's window round
robin across keys. ``outbox_fair_inflight`` counts a queue's published and
unfinished jobs per key: the window's accounting lives in PostgreSQL only.

The downgrade drops the column and the table: every row is a plain row of the
relay's work list again (the index is rebuilt as 0001 made it).
docs/job-control.md#fair-queues.

Revision ID: 0011_fair_queues
Revises: 0010_job_control
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0011_fair_queues"
down_revision = "0010_job_control"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE {schema}.fair_queues (
    queue       {schema}.queue_name PRIMARY KEY,
    key_arg     text        NOT NULL CHECK (length(key_arg) BETWEEN 1 AND 200),
    window_size integer     CHECK (window_size IS NULL OR window_size BETWEEN 1 AND 1000000),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text
);

ALTER TABLE {schema}.outbox ADD COLUMN fair_key text;

DROP INDEX {schema}.outbox_unpublished_id;
CREATE INDEX outbox_unpublished_id ON {schema}.outbox (id)
    WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND fair_key IS NULL;
-- A fair queue's waiting jobs by key, highest priority then oldest first within a key.
CREATE INDEX outbox_fair_waiting ON {schema}.outbox (queue, fair_key, priority DESC, id)
    WHERE fair_key IS NOT NULL AND published_at IS NULL AND state IN ('pending', 'retrying');
-- A fair queue's window: its published, unfinished jobs per key.
CREATE INDEX outbox_fair_inflight ON {schema}.outbox (queue, fair_key)
    WHERE fair_key IS NOT NULL AND state IN ('queued', 'running');
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS {schema}.outbox_fair_inflight;
DROP INDEX IF EXISTS {schema}.outbox_fair_waiting;
DROP INDEX IF EXISTS {schema}.outbox_unpublished_id;
ALTER TABLE {schema}.outbox DROP COLUMN IF EXISTS fair_key;
CREATE INDEX outbox_unpublished_id ON {schema}.outbox (id)
    WHERE published_at IS NULL AND state IN ('pending', 'retrying');
DROP TABLE IF EXISTS {schema}.fair_queues;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
