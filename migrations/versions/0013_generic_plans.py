"""The claim, the outcome and the relay's mark as functions whose plans PostgreSQL keeps.

A worker sends its claim (``JOB_CLAIM_ATTEMPTS``) and its outcomes
(``JOB_RECORD_OUTCOMES``), and the relay its mark (``JOB_MARK_PUBLISHED``), as
prepared statements. PostgreSQL plans a prepared statement's first five runs for
their parameters, then keeps a generic plan only if its estimated cost is no
higher than theirs. For these statements (common table expressions, arrays of
unknown length) that depends on the statistics: over a backlog of claimable
rows the estimates kept the custom plans, and every run was planned again. At
one job per call (a worker claiming one delivery at a time while a backlog
waits), planning was most of their cost: a one-row claim took 530-800 us of its
backend's CPU, 310-330 us with the plan kept; an outcome 630-710 us, 360-380
us; a mark 730-780 us, 340-400 us (docs/benchmarks.md, "Plans kept per
connection").

Here the statements become PL/pgSQL functions, ``claim_attempts()``,
``record_outcomes()`` and ``mark_published()``, declared
``SET plan_cache_mode = force_generic_plan``:
their statements are planned once per connection, for any parameters, and the
setting holds only while the function runs (a handler's own statements on the
same connection are planned as before). A generic plan cannot see the ids, so
each finds its rows by primary key whatever the statistics say: their state
conditions are wrapped in ``IS TRUE`` (no index on ``state`` can serve them). A
1,000-row mark's generic plan still hashes the ids to their stream entries.

The statements are those of ``jobs/sql.py`` before this revision, unchanged but
for their parameters, which are the functions' arguments; what they return is
the same, column for column. The claim's ``set_config('synchronous_commit',
'off', true)`` still lasts to the end of the caller's transaction (a function's
``SET`` clause restores only the setting it names).

Revision ID: 0013_generic_plans
Revises: 0012_workflow_events
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0013_generic_plans"
down_revision = "0012_workflow_events"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE FUNCTION {schema}.claim_attempts(_ids bigint[], _entries text[], _worker text, _lease double precision)
RETURNS TABLE (id bigint, state text, attempts integer, max_attempts integer, timeout_seconds double precision,
               keep_result boolean, enq_ms bigint, isolate boolean)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT o.id, o.state AS old_state, o.attempts AS old_attempts, o.claimed_by AS old_worker,
               o.started_at AS old_started_at, x.refund, x.spared,
               _entries[array_position(_ids, o.id)] AS entry,
               CASE WHEN o.expires_at IS NOT NULL AND o.expires_at <= now() THEN 'expired'
                    WHEN o.attempts - x.spared >= o.max_attempts AND NOT x.refund THEN 'dead'
                    ELSE 'running' END AS verdict
          FROM {schema}.outbox o
         CROSS JOIN LATERAL (
               SELECT CASE WHEN o.state = 'running' AND o.claimed_by IS DISTINCT FROM _worker
                           THEN NOT EXISTS (SELECT 1 FROM {schema}.job_attempts a
                                             WHERE a.outbox_id = o.id AND a.attempt = o.attempts)
                           ELSE false END AS refund,
                      CASE WHEN o.attempts = 0 THEN 0
                           ELSE (SELECT count(*)::int FROM {schema}.job_attempts a
                                  WHERE a.outbox_id = o.id AND a.attempt BETWEEN 1 AND o.attempts
                                    AND a.outcome = 'lost' AND a.error_class = 'Interrupted') END AS spared
         ) x
         WHERE o.id = ANY(_ids)
           AND ((o.state IN ('pending', 'queued', 'retrying') AND o.available_at <= now())
                OR (o.state = 'running' AND o.lease_until < now())) IS TRUE
         ORDER BY o.id
           FOR UPDATE OF o
    ), claimed AS (
        UPDATE {schema}.outbox o
           SET state = l.verdict,
               attempts = o.attempts + (l.verdict = 'running')::int,
               claimed_by = CASE WHEN l.verdict = 'running' THEN _worker END,
               lease_until = CASE WHEN l.verdict = 'running' THEN now() + make_interval(secs => _lease) END,
               started_at = CASE WHEN l.verdict = 'running' THEN now() ELSE o.started_at END,
               finished_at = CASE WHEN l.verdict = 'running' THEN NULL ELSE now() END,
               published_at = coalesce(o.published_at, now()),
               stream_id = CASE WHEN l.verdict = 'running' THEN l.entry ELSE o.stream_id END,
               publish_count = o.publish_count + (o.published_at IS NULL)::int,
               last_error_class = CASE WHEN l.verdict = 'dead' THEN 'AttemptsExhausted'
                                       WHEN l.refund THEN 'Interrupted'
                                       ELSE o.last_error_class END,
               last_error = CASE WHEN l.verdict = 'dead'
                                 THEN 'every attempt was used; the last run never recorded an outcome (worker lost)'
                                 WHEN l.refund
                                 THEN 'attempt ' || o.attempts || ' was interrupted: its worker ('
                                      || coalesce(l.old_worker, '?') || ') was lost while running it with other '
                                      || 'jobs; not charged, run again alone'
                                 ELSE o.last_error END,
               result = CASE WHEN l.verdict = 'dead' THEN jsonb_build_object('error', jsonb_build_object(
                                 'class', 'AttemptsExhausted',
                                 'message',
                                 'every attempt was used; the last run never recorded an outcome (worker lost)'))
                             ELSE o.result END
          FROM locked l
         WHERE o.id = l.id
     RETURNING o.id, o.state, o.attempts, o.max_attempts + l.spared + l.refund::int AS max_attempts,
               o.timeout_seconds, o.keep_result, (extract(epoch FROM o.created_at) * 1000)::int8 AS enq_ms,
               l.old_state, l.old_attempts
    ), lost AS (
        INSERT INTO {schema}.job_attempts AS a
               (outbox_id, attempt, worker_id, started_at, finished_at, outcome, error_class, error)
        SELECT l.id, l.old_attempts, l.old_worker, coalesce(l.old_started_at, now()), now(), 'lost',
               CASE WHEN l.refund THEN 'Interrupted' END,
               CASE WHEN l.refund THEN 'its worker was lost while running it with other jobs; not charged' END
          FROM locked l WHERE l.old_state = 'running'
        ON CONFLICT (outbox_id, attempt) DO UPDATE SET finished_at = now(), outcome = 'lost'
         WHERE a.finished_at IS NULL
    )
    SELECT c.id, c.state, c.attempts, c.max_attempts, c.timeout_seconds, c.keep_result, c.enq_ms,
           c.old_state = 'running'
      FROM claimed c CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit;
END;
$$;

CREATE FUNCTION {schema}.record_outcomes(
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

CREATE FUNCTION {schema}.mark_published(_ids bigint[], _sids text[], _term bigint)
RETURNS TABLE (leads boolean, marked bigint, next_due double precision)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lead AS (
        SELECT _term IS NULL OR coalesce(max(r.term), 0) <= _term AS leads FROM {schema}.relays r
    ), locked AS MATERIALIZED (
        SELECT j.ctid FROM {schema}.outbox j
         WHERE (SELECT l.leads FROM lead l)
           AND j.id = ANY(_ids) AND (j.published_at IS NULL AND j.state IN ('pending', 'retrying')) IS TRUE
         ORDER BY j.id
           FOR UPDATE
    ), marked AS (
        UPDATE {schema}.outbox AS o
           SET state = 'queued', published_at = now(), publish_count = o.publish_count + 1, stream_id = u.sid
          FROM unnest(_ids, _sids) AS u(id, sid)
         WHERE o.ctid = ANY(ARRAY(SELECT k.ctid FROM locked k)) AND o.id = u.id
        RETURNING 1
    )
    SELECT (SELECT l.leads FROM lead l), (SELECT count(*) FROM marked),
           (SELECT extract(epoch FROM min(d.available_at) - now())::float8
              FROM {schema}.outbox d
             WHERE d.published_at IS NULL AND d.state IN ('pending', 'retrying') AND d.available_at > now());
END;
$$;
"""

DOWNGRADE = r"""
DROP FUNCTION {schema}.mark_published(bigint[], text[], bigint);
DROP FUNCTION {schema}.record_outcomes(text, bigint[], integer[], text[], text[], double precision[], text[],
                                       double precision[], text[], text[], text[], boolean, text);
DROP FUNCTION {schema}.claim_attempts(bigint[], text[], text, double precision);
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
