"""A ``ctx.transaction()`` job's success timed when it commits, not when it began.

``record_success()`` (migration 0006) stamped ``finished_at`` with ``now()``,
which in PostgreSQL is the start of the *transaction*: a ``ctx.transaction()``
job's transaction begins with its processed-jobs row, before the body runs, so
a handler that worked 6 s inside it was recorded as finished a few
milliseconds after it started. This revision replaces the function with one
that reads the clock when the success is written (``clock_timestamp()``, once,
for the outbox row and the history row alike), right before the ``COMMIT`` that
is sent with it. ``JOB_RECORD_OUTCOMES`` (jobs/sql.py) reads the clock the
same way, so the two still write the same rows.

Nothing else changes: same signature, same fence (SQLSTATE ``PB001``), same
objects; the downgrade puts 0006's function back.

Revision ID: 0007_commit_time
Revises: 0006_job_transaction
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0007_commit_time"
down_revision = "0006_job_transaction"
branch_labels = None
depends_on = None

# The function of 0006 with one clock reading, taken when the success is written.
UPGRADE = r"""
CREATE OR REPLACE FUNCTION {schema}.record_success(_job bigint, _worker text, _attempt integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    _started timestamptz;
    _done timestamptz := clock_timestamp();
BEGIN
    UPDATE {schema}.outbox
       SET state = 'succeeded', finished_at = _done, claimed_by = NULL, lease_until = NULL,
           result = NULL, result_expires_at = NULL
     WHERE id = _job AND claimed_by = _worker AND state = 'running' AND attempts = _attempt
    RETURNING started_at INTO _started;
    IF NOT FOUND THEN
        PERFORM {schema}.require_current_attempt(0, _job, _attempt);  -- raises PB001 (migration 0005)
    END IF;
    INSERT INTO {schema}.job_attempts AS a
           (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error, traceback)
    VALUES (_job, _attempt, _worker, coalesce(_started, _done), _done, 'succeeded', NULL, NULL, NULL)
    ON CONFLICT (outbox_id, attempt) DO UPDATE
       SET finished_at = excluded.finished_at, outcome = excluded.outcome,
           error_class = excluded.error_class, error = excluded.error, traceback = excluded.traceback;
    RETURN 1;
END;
$$;
"""

# 0006's function, as it was.
DOWNGRADE = r"""
CREATE OR REPLACE FUNCTION {schema}.record_success(_job bigint, _worker text, _attempt integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    _started timestamptz;
BEGIN
    UPDATE {schema}.outbox
       SET state = 'succeeded', finished_at = now(), claimed_by = NULL, lease_until = NULL,
           result = NULL, result_expires_at = NULL
     WHERE id = _job AND claimed_by = _worker AND state = 'running' AND attempts = _attempt
    RETURNING started_at INTO _started;
    IF NOT FOUND THEN
        PERFORM {schema}.require_current_attempt(0, _job, _attempt);  -- raises PB001 (migration 0005)
    END IF;
    INSERT INTO {schema}.job_attempts AS a
           (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error, traceback)
    VALUES (_job, _attempt, _worker, coalesce(_started, now()), now(), 'succeeded', NULL, NULL, NULL)
    ON CONFLICT (outbox_id, attempt) DO UPDATE
       SET finished_at = excluded.finished_at, outcome = excluded.outcome,
           error_class = excluded.error_class, error = excluded.error, traceback = excluded.traceback;
    RETURN 1;
END;
$$;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
