"""The two statements of a job's own transaction as functions: plans kept per connection.

``ctx.transaction()`` sends ``BEGIN`` with the processed-jobs row, and the
job's success with ``COMMIT``, each as one simple query of two statements (one
round trip each, worker/context.py). A simple query is parsed and planned every
time it runs; for the success (an UPDATE of the outbox, an upsert of its
history row and the fence's check, as one statement) that planning cost
PostgreSQL more than executing it. The statements inside a PL/pgSQL function
are planned once per connection and their plans kept, so the simple query now
only calls these two functions:

- ``begin_processed(job)`` inserts the processed-jobs row; it returns the job's
  id, or NULL when the row is already there (committed by an earlier run).
- ``record_success(job, worker, attempt)`` records the success of that attempt,
  fenced as before: when the job is no longer that worker's running attempt it
  raises SQLSTATE ``PB001`` (``postbox.sql.STALE_ATTEMPT_SQLSTATE``), the
  transaction aborts, and the ``COMMIT`` behind it never runs.

What they write is what ``JOB_RECORD_OUTCOMES`` writes for one success
(jobs/sql.py keeps the statements side by side; a test compares the rows).

Revision ID: 0006_job_transaction
Revises: 0005_fenced_success
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0006_job_transaction"
down_revision = "0005_fenced_success"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE FUNCTION {schema}.begin_processed(_job bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    _fresh bigint;
BEGIN
    INSERT INTO {schema}.processed_jobs (outbox_id) VALUES (_job)
    ON CONFLICT (outbox_id) DO NOTHING RETURNING outbox_id INTO _fresh;
    RETURN _fresh;
END;
$$;

CREATE FUNCTION {schema}.record_success(_job bigint, _worker text, _attempt integer)
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

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS {schema}.record_success(bigint, text, integer);
DROP FUNCTION IF EXISTS {schema}.begin_processed(bigint);
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
