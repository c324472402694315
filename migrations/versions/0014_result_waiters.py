"""Result notifications only where someone listens: waiters registered in ``result_waiters``, workflows.

Every outcome batch used to NOTIFY ``postbox_results`` with the ids of the jobs it
ended, for two listeners: a caller of :func:`postbox.results.wait_result` (and the
API's ``GET /jobs/{id}/result?wait=``), and the leading relay, which learns that a
workflow may have ended from its jobs' ends. Most jobs have neither. A NOTIFY is not
free: PostgreSQL takes one lock for every notifying commit in the cluster and holds
it through the commit's WAL flush, so each outcome batch's commit queued with every
enqueue's (the outbox trigger NOTIFYs too), and it woke every listening session of
the database (docs/benchmarks.md, "Result notifications where someone listens").

Now a waiter registers first (a row in ``result_waiters``, deleted when it stops
waiting, and by the next waiter's registration once it is a minute past its
deadline), and ``record_outcomes()`` NOTIFYs only the ids of jobs that belong to a
workflow or have a waiter. ``notify_results()`` does the same for jobs whose
success committed in their own ``ctx.transaction()`` (the worker sends it once
their results are set). The check runs in a statement of its own, after the
outcome's rows are locked: a waiter registered before it is seen; one registered
after it reads the row after the outcome commits, or on its first re-read.

Revision ID: 0014_result_waiters
Revises: 0013_generic_plans
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0014_result_waiters"
down_revision = "0013_generic_plans"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE {schema}.result_waiters (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    until  timestamptz NOT NULL
);
CREATE INDEX result_waiters_job ON {schema}.result_waiters (job_id);

CREATE FUNCTION {schema}.notify_results(_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    _heard text;
BEGIN
    SELECT string_agg(o.id::text, ',' ORDER BY o.id) INTO _heard
      FROM {schema}.outbox o
     WHERE o.id = ANY(_ids)
       AND (o.workflow_id IS NOT NULL OR EXISTS (SELECT 1 FROM {schema}.result_waiters w WHERE w.job_id = o.id));
    IF _heard IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify('postbox_results', _heard);
    RETURN 1;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.record_outcomes(
    _worker text, _ids bigint[], _attempts integer[], _states text[], _outcomes text[], _delays double precision[],
    _results text[], _result_ttls double precision[], _error_classes text[], _errors text[], _tracebacks text[],
    _notify boolean, _also_notify text)
RETURNS TABLE (id bigint, notified bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    _done bigint[];
    _ended bigint[];
    _heard text;
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
     RETURNING j.id, j.state, j.attempts, f.i, j.started_at
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
           coalesce(array_agg(d.id) FILTER (WHERE d.state <> 'retrying'), ARRAY[]::bigint[])
      INTO _done, _ended
      FROM done d;
    IF _notify THEN
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

# 0013's function, as it was.
DOWNGRADE = r"""
CREATE OR REPLACE FUNCTION {schema}.record_outcomes(
    _worker text, _ids bigint[], _attempts integer[], _states text[], _outcomes text[], _delays double precision[],
    _results text[], _result_ttls double precision[], _error_classes text[], _errors text[], _tracebacks text[],
    _notify boolean, _also_notify text)
RETURNS TABLE (id bigint, notified bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
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
     RETURNING j.id, j.state, j.attempts, f.i, j.started_at
    ), history AS (
        INSERT INTO {schema}.job_attempts AS a
               (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error, traceback)
        SELECT d.id, d.attempts, _worker, coalesce(d.started_at, c.at), c.at, _outcomes[d.i],
               _error_classes[d.i], _errors[d.i], _tracebacks[d.i]
          FROM done d CROSS JOIN clock c
        ON CONFLICT (outbox_id, attempt) DO UPDATE
           SET finished_at = excluded.finished_at, outcome = excluded.outcome,
               error_class = excluded.error_class, error = excluded.error, traceback = excluded.traceback
    ), woken AS (
        SELECT pg_notify('postbox_results', concat_ws(',', string_agg(d.id::text, ','), _also_notify)) AS n
          FROM done d WHERE _notify AND d.state <> 'retrying'
        HAVING count(*) > 0 OR _also_notify IS NOT NULL
    )
    SELECT d.id, (SELECT count(*) FROM woken) FROM done d;
END;
$$;

DROP FUNCTION {schema}.notify_results(bigint[]);
DROP TABLE {schema}.result_waiters;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
