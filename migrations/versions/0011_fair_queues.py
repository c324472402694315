"""Fair queues (issue 32): a queue serves its jobs' fairness keys in turn.

Stub: the schema lands in the following commit.

Revision ID: 0011_fair_queues
Revises: 0010_job_control
Create Date: 2026-12-02
"""

from __future__ import annotations

revision = "0011_fair_queues"
down_revision = "0010_job_control"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
