"""A job that succeeded in its own ``ctx.transaction()`` is announced at its commit, when someone listens.

Such a job's success is written by ``record_success()`` in the handler's own
transaction. Its result waiters (and the relay, for a workflow's job) were told
afterwards by the worker, one more statement per outcome batch (``RESULTS_NOTIFY``),
sent whether or not anybody listened. Now ``record_success()`` NOTIFYs
``postbox_results`` itself, in the job's transaction, for a job that has a waiter
(``result_waiters``, migration 0014) or belongs to a workflow; the check runs in a
statement of its own after the row is locked, as ``record_outcomes()``'s does.
A job that keeps its result is left to the worker, which sets the result after
the commit (the handler's return value) and then announces it as before.

Revision ID: 0016_success_notice
Revises: 0015_mark_attempts
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0016_success_notice"
down_revision = "0015_mark_attempts"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE OR REPLACE FUNCTION {schema}.record_success(_job bigint, _worker text, _attempt integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    _started timestamptz;
    _done timestamptz := clock_timestamp();
    _keeps boolean;
    _workflow bigint;
BEGIN
    UPDATE {schema}.outbox
       SET state = 'succeeded', finished_at = _done, claimed_by = NULL, lease_until = NULL,
           result = NULL, result_expires_at = NULL
     WHERE id = _job AND claimed_by = _worker AND state = 'running' AND attempts = _attempt
    RETURNING started_at, keep_result, workflow_id INTO _started, _keeps, _workflow;
    IF NOT FOUND THEN
        PERFORM {schema}.require_current_attempt(0, _job, _attempt);  -- raises PB001 (migration 0005)
    END IF;
    INSERT INTO {schema}.job_attempts AS a
           (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error, traceback)
    VALUES (_job, _attempt, _worker, coalesce(_started, _done), _done, 'succeeded', NULL, NULL, NULL)
    ON CONFLICT (outbox_id, attempt) DO UPDATE
       SET finished_at = excluded.finished_at, outcome = excluded.outcome,
           error_class = excluded.error_class, error = excluded.error, traceback = excluded.traceback;
    -- Announced at commit if someone listens (migration 0014): checked in a statement of its own,
    -- after the row is locked. A job that keeps its result is announced by the worker once the
    -- result is set (it is known only when the handler returns).
    IF NOT _keeps
       AND (_workflow IS NOT NULL OR EXISTS (SELECT 1 FROM {schema}.result_waiters w WHERE w.job_id = _job)) THEN
        PERFORM pg_notify('postbox_results', _job::text);
    END IF;
    RETURN 1;
END;
$$;
"""

# 0007's function, as it was.
DOWNGRADE = r"""
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


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
