"""The relay publishes a backlog highest priority first.

The relay selected due, unpublished rows in id order (``outbox_unpublished_id``),
so a backlog went out oldest first whatever its priorities: a bulk insert of
priority-9 jobs behind 100,000 priority-0 ones waited for all of them to be
published before a worker could see it, and strict priority held only among
what Redis already had. The select now orders by priority (highest first), then
id, through this index, which holds the same rows as ``outbox_unpublished_id``.

``outbox_unpublished_id`` stays: a relay of an earlier version (a rolling
deploy) still selects in id order. It costs one more index entry per enqueued
job, which a later migration can take back once no such relay runs.

Revision ID: 0021_publish_by_priority
Revises: 0020_outcome_notice
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0021_publish_by_priority"
down_revision = "0020_outcome_notice"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE INDEX outbox_unpublished_priority ON {schema}.outbox (priority DESC, id)
    WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND fair_key IS NULL;
"""

DOWNGRADE = r"""
DROP INDEX IF EXISTS {schema}.outbox_unpublished_priority;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
