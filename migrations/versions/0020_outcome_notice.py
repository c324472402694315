"""The outcome looks for result waiters only when there can be one to tell.

``record_outcomes()`` (migration 0014) ends with a statement of its own that
finds which of the batch's ended jobs belong to a workflow or have a waiter in
``result_waiters``, and NOTIFYs ``postbox_results`` with their ids. It read
the batch's rows again by key to do so, on every outcome: most batches have
neither a workflow job nor a waiter, and the statement cost about 5 % of the
function on a 50-row batch and 7 % on one row (docs/benchmarks.md,
twenty-third round). It now runs only when an ended job of the batch belongs
to a workflow (known from the update's own ``RETURNING``), when jobs that
committed in their own ``ctx.transaction()`` are passed on, or when any
waiter is registered at all; otherwise nobody can be owed a notice, and it
would have found none. The check of ``result_waiters`` is a query of its own
after the rows were locked, as the statement it guards is, so a waiter
registered before it is seen and one registered after it reads the row once
the outcome commits (migration 0014).

Revision ID: 0020_outcome_notice
Revises: 0019_mark_due
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0020_outcome_notice"
down_revision = "0019_mark_due"
branch_labels = None
depends_on = None

# 0014's function with 0017's settings (CREATE OR REPLACE keeps only the SET clauses it names), the
# workflow flag from the update's RETURNING, and the notice's condition.
FUNCTION = r"""
CREATE OR REPLACE FUNCTION {schema}.record_outcomes(
    _worker text, _ids bigint[], _attempts integer[], _states text[], _outcomes text[], _delays double precision[],
    _results text[], _result_ttls double precision[], _error_classes text[], _errors text[], _tracebacks text[],
    _notify boolean, _also_notify text)
RETURNS TABLE (id bigint, notified bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET random_page_cost = 1.1 AS $$
#variable_conflict use_column
DECLARE
    _done bigint[];
    _ended bigint[];
    _heard text;
    _flowing boolean;  -- an ended job belongs to a workflow
BEGIN
    WITH clock AS MATERIALIZED (
        SELECT clock_timestamp() AS at
    ), fenced AS (
        SELECT j.id, array_position(_ids, j.id) AS i
          FROM {schema}.outbox j
         WHERE j.id = ANY(_ids) AND (j.claimed_by = _worker AND j.state = 'running') IS TRUE
         ORDER BY j.id
           FOR UPDATE
    ), done AS (
        UPDATE {schema}.outbox j
           SET state = _states[f.i],
               finished_at = CASE WHEN _states[f.i] = 'retrying' THEN NULL ELSE (SELECT at FROM clock) END,
               available_at = CASE WHEN _states[f.i] = 'retrying'
                                   THEN (SELECT at FROM clock) + make_interval(secs => _delays[f.i])
                                   ELSE j.available_at END,
               published_at = CASE WHEN _states[f.i] = 'retrying' THEN NULL ELSE j.published_at END,
               claimed_by = NULL,
               lease_until = NULL,
               result = (_results[f.i])::jsonb,
               result_expires_at = CASE WHEN _results[f.i] IS NULL THEN NULL
                                        ELSE now() + make_interval(secs => _result_ttls[f.i]) END,
               last_error_class = coalesce(_error_classes[f.i], j.last_error_class),
               last_error = coalesce(_errors[f.i], j.last_error),
               max_attempts = j.max_attempts + CASE WHEN _outcomes[f.i] = 'snoozed' THEN 1 ELSE 0 END
          FROM fenced f
         WHERE j.id = f.id AND j.attempts = _attempts[f.i]
     RETURNING j.id, j.state, j.attempts, f.i, j.started_at, j.workflow_id
    ), history AS (
        INSERT INTO {schema}.job_attempts AS a
               (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error, traceback)
        SELECT d.id, d.attempts, _worker, coalesce(d.started_at, c.at), c.at, _outcomes[d.i],
               _error_classes[d.i], _errors[d.i], _tracebacks[d.i]
          FROM done d CROSS JOIN clock c
        ON CONFLICT (outbox_id, attempt) DO UPDATE
           SET finished_at = excluded.finished_at, outcome = excluded.outcome,
               error_class = excluded.error_class, error = excluded.error, traceback = excluded.traceback
    )
    SELECT coalesce(array_agg(d.id), ARRAY[]::bigint[]),
           coalesce(array_agg(d.id) FILTER (WHERE d.state <> 'retrying'), ARRAY[]::bigint[]),
           coalesce(bool_or(d.workflow_id IS NOT NULL) FILTER (WHERE d.state <> 'retrying'), false)
      INTO _done, _ended, _flowing
      FROM done d;
    IF {notice} THEN
        -- A statement of its own: its snapshot is taken after the rows above were locked, so a
        -- waiter registered before then is seen, and one registered later reads the row after
        -- this transaction's end (postbox.results.wait_result).
        SELECT string_agg(o.id::text, ',' ORDER BY o.id) INTO _heard
          FROM {schema}.outbox o
         WHERE o.id = ANY(_ended || coalesce(string_to_array(_also_notify, ',')::bigint[], ARRAY[]::bigint[]))
           AND (o.workflow_id IS NOT NULL
                OR EXISTS (SELECT 1 FROM {schema}.result_waiters w WHERE w.job_id = o.id));
        IF _heard IS NOT NULL THEN
            PERFORM pg_notify('postbox_results', _heard);
        END IF;
    END IF;
    RETURN QUERY SELECT d, (_heard IS NOT NULL)::int::bigint FROM unnest(_done) AS d;
END;
$$;
"""
UPGRADE = FUNCTION.replace(
    "{notice}",
    "_notify AND (_flowing OR _also_notify IS NOT NULL OR EXISTS (SELECT 1 FROM {schema}.result_waiters))",
)
DOWNGRADE = FUNCTION.replace("{notice}", "_notify")


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
