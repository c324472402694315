"""job_attempts without its foreign key to the outbox.

The key's check ran once per attempt row a worker's claim inserts (a lookup
and a KEY SHARE lock on the outbox row the claim had just locked itself):
about a tenth of PostgreSQL's CPU per job in a no-op drain. The statements
that delete outbox rows (retention, the dead-letter purge) now delete their
attempts in the same statement, which is what ON DELETE CASCADE did.

Revision ID: 0003_attempts_without_fk
Revises: 0002_stagedoor
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0003_attempts_without_fk"
down_revision = "0002_stagedoor"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE job_attempts DROP CONSTRAINT IF EXISTS job_attempts_outbox_id_fkey;
"""

DOWNGRADE = r"""
DELETE FROM job_attempts a WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = a.outbox_id);
ALTER TABLE job_attempts
    ADD CONSTRAINT job_attempts_outbox_id_fkey FOREIGN KEY (outbox_id) REFERENCES outbox (id) ON DELETE CASCADE;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
