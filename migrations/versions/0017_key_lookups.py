"""The claim, the outcome, the relay's mark and the fenced success look their rows up by primary key on any outbox.

These functions keep one generic plan per connection (migration 0013), made at
their first call. On an outbox that was small or never analyzed then (a new
installation, a quiet shop, a benchmark that starts from an empty table) the
planner took a sequential scan as cheapest for "the rows whose id is in this
array", and the connection kept that plan while the table grew, until an
ANALYZE replaced it: every call then read the whole outbox. On 1,500 rows a
one-job claim cost its backend 380 µs of CPU instead of 200
(docs/benchmarks.md, "Key lookups"). The rows are always named by id, a few per
call. The functions now plan with ``random_page_cost`` at 1.1 (an index page
read from memory costs about what a sequential one does, as it does for these
hot rows): the primary key then wins on any table, a three-row one included.
The setting holds inside the functions only.

``record_success()`` (a ``ctx.transaction()`` job's fenced success) gets the
same setting, and its fence's conditions are wrapped in ``IS TRUE`` as the
claim's are: on a small outbox its planner took ``outbox_live_state`` (every
running entry, and the dead ones updates left) and filtered by id.

``enable_seqscan = off`` does the same for the claim, and was tried first: it
made the relay's mark take 165 ms a call (every plan that keeps a sequential
scan, of the small ``relays`` table here, costs the same huge penalty, and the
planner's comparisons of the rest lose their meaning).

Revision ID: 0017_key_lookups
Revises: 0016_success_notice
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0017_key_lookups"
down_revision = "0016_success_notice"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER FUNCTION {schema}.claim_attempts(bigint[], text[], text, double precision) SET random_page_cost = 1.1;
ALTER FUNCTION {schema}.mark_published(bigint[], text[], bigint, integer[]) SET random_page_cost = 1.1;
ALTER FUNCTION {schema}.record_outcomes(text, bigint[], integer[], text[], text[], double precision[], text[],
                                        double precision[], text[], text[], text[], boolean, text)
    SET random_page_cost = 1.1;
ALTER FUNCTION {schema}.notify_results(bigint[]) SET random_page_cost = 1.1;

-- 0016's function, its row found by key only (the fence's conditions in IS TRUE, as in the claim).
CREATE OR REPLACE FUNCTION {schema}.record_success(_job bigint, _worker text, _attempt integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE SET random_page_cost = 1.1 AS $$
DECLARE
    _started timestamptz;
    _done timestamptz := clock_timestamp();
    _keeps boolean;
    _workflow bigint;
BEGIN
    UPDATE {schema}.outbox
       SET state = 'succeeded', finished_at = _done, claimed_by = NULL, lease_until = NULL,
           result = NULL, result_expires_at = NULL
     WHERE id = _job AND (claimed_by = _worker AND state = 'running' AND attempts = _attempt) IS TRUE
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

DOWNGRADE = r"""
ALTER FUNCTION {schema}.claim_attempts(bigint[], text[], text, double precision) RESET random_page_cost;
ALTER FUNCTION {schema}.mark_published(bigint[], text[], bigint, integer[]) RESET random_page_cost;
ALTER FUNCTION {schema}.record_outcomes(text, bigint[], integer[], text[], text[], double precision[], text[],
                                        double precision[], text[], text[], text[], boolean, text)
    RESET random_page_cost;
ALTER FUNCTION {schema}.notify_results(bigint[]) RESET random_page_cost;

-- 0016's function, as it was (CREATE OR REPLACE without a SET clause also drops the setting).
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


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
