"""A refused fence as an error: ``require_current_attempt()``.

A ``ctx.transaction()`` job's success is written in the handler's own
transaction, and the worker sends that statement and ``COMMIT`` together
(one simple query, one round trip). When the fence refuses the outcome (a
newer attempt owns the job) nothing may commit, so the statement itself must
fail: ``JOB_RECORD_SUCCESS`` (jobs/sql.py) ends by passing the
number of rows it recorded to this function, which raises SQLSTATE ``PB001``
(``postbox.sql.STALE_ATTEMPT_SQLSTATE``) when it is 0. The error aborts the
transaction, PostgreSQL skips the ``COMMIT`` behind it, and the worker maps the
error to ``StaleAttempt``. docs/idempotent-handlers.md.

Revision ID: 0005_fenced_success
Revises: 0004_unique_jobs
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0005_fenced_success"
down_revision = "0004_unique_jobs"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- ``recorded``: how many outcome rows the statement calling it wrote (0 or 1).
CREATE FUNCTION {schema}.require_current_attempt(recorded bigint, job bigint, attempt integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF recorded = 0 THEN
        RAISE EXCEPTION 'postbox: job % attempt % is no longer current; its transaction rolls back', job, attempt
            USING ERRCODE = 'PB001';
    END IF;
    RETURN recorded;
END;
$$;
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS {schema}.require_current_attempt(bigint, bigint, integer);
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
