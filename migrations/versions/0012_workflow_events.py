"""Workflow lifecycle events (issue 31).

Stub: the schema lands in the following commit.

Revision ID: 0012_workflow_events
Revises: 0011_fair_queues
Create Date: 2026-12-02
"""

from __future__ import annotations

revision = "0012_workflow_events"
down_revision = "0011_fair_queues"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
