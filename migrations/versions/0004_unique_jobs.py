"""Unique jobs: a task's uniqueness rule, the key each job of it holds.

``tasks.unique_rule`` is a task's rule as published by workers and the API
(``{{period, states, by, defaults}}``, jobs/unique.py); ``outbox.unique_key``
the key a job of such a task holds (its task and the JSON of the key's
arguments). ``unique_claim()`` computes a key, takes its advisory lock for the
transaction and finds the job holding it; ``enqueue()`` is replaced by the same
function applying the published rule (same signature, same behaviour for a task
without one). docs/unique-jobs.md.

Revision ID: 0004_unique_jobs
Revises: 0003_flow_control
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0004_unique_jobs"
down_revision = "0003_flow_control"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE {schema}.tasks ADD COLUMN unique_rule jsonb;  -- NULL: no rule
ALTER TABLE {schema}.outbox ADD COLUMN unique_key text;   -- NULL: its task had no rule when it was enqueued
-- A key's jobs, newest first: the holder lookup reads the first rows of its key.
CREATE INDEX outbox_unique_key ON {schema}.outbox (unique_key, created_at DESC) WHERE unique_key IS NOT NULL;

-- The key of a job of ``task`` with ``args`` under ``rule``: the task's name and the
-- JSON (jsonb's canonical text) of the arguments the rule names, defaults filled in;
-- hashed (sha256) past 200 characters. Then, under the key's advisory lock (held
-- until the transaction ends), the newest job holding it: created less than
-- ``period`` seconds ago and/or in one of ``states``. VOLATILE, so the lookup takes
-- its snapshot after the lock is granted: a concurrent enqueuer's job, committed
-- while this one waited, is found (at READ COMMITTED).
CREATE FUNCTION {schema}.unique_claim(task text, args jsonb, rule jsonb, OUT unique_key text, OUT holder bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    key_args text;
    names text[];
    period double precision;
    states text[];
BEGIN
    IF rule IS NULL OR jsonb_typeof(rule) <> 'object' THEN
        RAISE EXCEPTION 'postbox.unique_claim: rule must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(rule -> 'by') = 'array' THEN
        names := ARRAY(SELECT jsonb_array_elements_text(rule -> 'by'));
    END IF;
    IF jsonb_typeof(rule -> 'states') = 'array' THEN
        states := ARRAY(SELECT jsonb_array_elements_text(rule -> 'states'));
    END IF;
    IF jsonb_typeof(rule -> 'period') = 'number' THEN
        period := (rule ->> 'period')::double precision;
    END IF;
    IF period IS NULL AND states IS NULL THEN
        RAISE EXCEPTION 'postbox.unique_claim: a rule needs a period or states' USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(jsonb_object_agg(e.key, e.value), '{{}}'::jsonb)::text INTO key_args
      FROM jsonb_each(CASE WHEN jsonb_typeof(rule -> 'defaults') = 'object' THEN rule -> 'defaults'
                           ELSE '{{}}'::jsonb END || coalesce(args, '{{}}'::jsonb)) AS e
     WHERE names IS NULL OR e.key = ANY(names);
    IF length(key_args) <= 200 THEN
        unique_key := task || ':' || key_args;
    ELSE
        unique_key := task || ':sha256:' || encode(sha256(convert_to(key_args, 'UTF8')), 'hex');
    END IF;
    -- 1970170225 is postbox.unique.LOCK_CLASS ("uniq"): the two-int form, apart from the relay's lock.
    PERFORM pg_advisory_xact_lock(1970170225, hashtext(unique_key));
    SELECT o.id INTO holder FROM {schema}.outbox o
     WHERE o.unique_key = unique_claim.unique_key
       AND (period IS NULL OR o.created_at > now() - make_interval(secs => period))
       AND (states IS NULL OR o.state = ANY(states))
     ORDER BY o.created_at DESC, o.id DESC
     LIMIT 1;
END;
$$;
"""

# The function as 0001 made it, but for the published rule, applied after the dedup key.
ENQUEUE = r"""
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task text,
    args jsonb DEFAULT '{{}}'::jsonb,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    timeout_seconds double precision DEFAULT NULL,
    keep_result boolean DEFAULT NULL,
    delay_seconds double precision DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    def {schema}.tasks%ROWTYPE;
    new_id bigint;
    ukey text;
    holder bigint;
BEGIN
    IF task IS NULL OR length(task) = 0 OR length(task) > 200 THEN
        RAISE EXCEPTION 'postbox.enqueue: task must be 1-200 characters' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO def FROM {schema}.tasks t WHERE t.name = enqueue.task;
    IF FOUND AND timeout_seconds IS NULL
       AND (queue IS NULL OR priority IS NULL OR max_attempts IS NULL OR keep_result IS NULL) THEN
        timeout_seconds := def.timeout_seconds;
    END IF;
    queue := coalesce(queue, def.queue, 'default');
    priority := coalesce(priority, def.priority, 5);
    max_attempts := coalesce(max_attempts, def.max_attempts, 5);
    keep_result := coalesce(keep_result, def.keep_result, false);
    IF queue !~ '^[a-z0-9][a-z0-9_-]{{0,63}}$' THEN
        RAISE EXCEPTION 'postbox.enqueue: invalid queue name %', quote_nullable(queue) USING ERRCODE = '22023';
    END IF;
    IF priority < 0 OR priority > 9 THEN
        RAISE EXCEPTION 'postbox.enqueue: priority must be 0-9, got %', priority USING ERRCODE = '22023';
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'postbox.enqueue: args must be a JSON object' USING ERRCODE = '22023';
    END IF;
    -- The worker's handlers (Python) take only 64-bit integers: refuse what they would refuse.
    IF jsonb_path_exists(args, 'strict $.** ? (@.type() == "number" && (@ > 9223372036854775807
                                                || @ < -9223372036854775808))') THEN
        RAISE EXCEPTION 'postbox.enqueue: args hold a number outside the signed 64-bit range'
            USING ERRCODE = '22003';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'postbox.enqueue: headers must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF max_attempts < 1 THEN
        RAISE EXCEPTION 'postbox.enqueue: max_attempts must be >= 1' USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND timeout_seconds <= 0 THEN
        RAISE EXCEPTION 'postbox.enqueue: timeout_seconds must be > 0' USING ERRCODE = '22023';
    END IF;
    IF def.unique_rule IS NOT NULL THEN
        -- The dedup key first: its holder is the answer, whatever the rule says.
        IF dedup_key IS NOT NULL THEN
            SELECT o.id INTO new_id FROM {schema}.outbox o
             WHERE o.queue = enqueue.queue AND o.dedup_key = enqueue.dedup_key;
            IF new_id IS NOT NULL THEN
                RETURN new_id;
            END IF;
        END IF;
        SELECT c.unique_key, c.holder INTO ukey, holder
          FROM {schema}.unique_claim(enqueue.task, enqueue.args, def.unique_rule) AS c;
        IF holder IS NOT NULL THEN
            RETURN holder;
        END IF;
    END IF;
    INSERT INTO {schema}.outbox AS o (queue, task, args, priority, available_at, dedup_key, max_attempts,
                                      headers, expires_at, timeout_seconds, keep_result, unique_key)
    VALUES (enqueue.queue, enqueue.task, enqueue.args, enqueue.priority,
            coalesce(enqueue.run_at, now() + make_interval(secs => coalesce(enqueue.delay_seconds, 0))),
            enqueue.dedup_key, enqueue.max_attempts, coalesce(enqueue.headers, '{{}}'::jsonb), enqueue.expires_at,
            enqueue.timeout_seconds, enqueue.keep_result, ukey)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING o.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT o.id INTO new_id FROM {schema}.outbox o
         WHERE o.queue = enqueue.queue AND o.dedup_key = enqueue.dedup_key;
    END IF;
    RETURN new_id;
END;
$$;
"""

# 0001's function, as it was.
ENQUEUE_0001 = r"""
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task text,
    args jsonb DEFAULT '{{}}'::jsonb,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    timeout_seconds double precision DEFAULT NULL,
    keep_result boolean DEFAULT NULL,
    delay_seconds double precision DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    def {schema}.tasks%ROWTYPE;
    new_id bigint;
BEGIN
    IF task IS NULL OR length(task) = 0 OR length(task) > 200 THEN
        RAISE EXCEPTION 'postbox.enqueue: task must be 1-200 characters' USING ERRCODE = '22023';
    END IF;
    IF queue IS NULL OR priority IS NULL OR max_attempts IS NULL OR keep_result IS NULL THEN
        SELECT * INTO def FROM {schema}.tasks t WHERE t.name = enqueue.task;
        IF FOUND AND timeout_seconds IS NULL THEN
            timeout_seconds := def.timeout_seconds;
        END IF;
    END IF;
    queue := coalesce(queue, def.queue, 'default');
    priority := coalesce(priority, def.priority, 5);
    max_attempts := coalesce(max_attempts, def.max_attempts, 5);
    keep_result := coalesce(keep_result, def.keep_result, false);
    IF queue !~ '^[a-z0-9][a-z0-9_-]{{0,63}}$' THEN
        RAISE EXCEPTION 'postbox.enqueue: invalid queue name %', quote_nullable(queue) USING ERRCODE = '22023';
    END IF;
    IF priority < 0 OR priority > 9 THEN
        RAISE EXCEPTION 'postbox.enqueue: priority must be 0-9, got %', priority USING ERRCODE = '22023';
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION 'postbox.enqueue: args must be a JSON object' USING ERRCODE = '22023';
    END IF;
    -- The worker's handlers (Python) take only 64-bit integers: refuse what they would refuse.
    IF jsonb_path_exists(args, 'strict $.** ? (@.type() == "number" && (@ > 9223372036854775807
                                                || @ < -9223372036854775808))') THEN
        RAISE EXCEPTION 'postbox.enqueue: args hold a number outside the signed 64-bit range'
            USING ERRCODE = '22003';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'postbox.enqueue: headers must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF max_attempts < 1 THEN
        RAISE EXCEPTION 'postbox.enqueue: max_attempts must be >= 1' USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND timeout_seconds <= 0 THEN
        RAISE EXCEPTION 'postbox.enqueue: timeout_seconds must be > 0' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {schema}.outbox AS o (queue, task, args, priority, available_at, dedup_key, max_attempts,
                                      headers, expires_at, timeout_seconds, keep_result)
    VALUES (enqueue.queue, enqueue.task, enqueue.args, enqueue.priority,
            coalesce(enqueue.run_at, now() + make_interval(secs => coalesce(enqueue.delay_seconds, 0))),
            enqueue.dedup_key, enqueue.max_attempts, coalesce(enqueue.headers, '{{}}'::jsonb), enqueue.expires_at,
            enqueue.timeout_seconds, enqueue.keep_result)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING o.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT o.id INTO new_id FROM {schema}.outbox o
         WHERE o.queue = enqueue.queue AND o.dedup_key = enqueue.dedup_key;
    END IF;
    RETURN new_id;
END;
$$;
"""

DOWNGRADE = r"""
DROP FUNCTION IF EXISTS {schema}.unique_claim(text, jsonb, jsonb);
DROP INDEX IF EXISTS {schema}.outbox_unique_key;
ALTER TABLE {schema}.outbox DROP COLUMN IF EXISTS unique_key;
ALTER TABLE {schema}.tasks DROP COLUMN IF EXISTS unique_rule;
"""


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.execute(render(UPGRADE, schema))
    op.execute(render(ENQUEUE, schema))


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    # The 0001 function first: it no longer names the columns about to go.
    op.execute(render(ENQUEUE_0001, schema))
    op.execute(render(DOWNGRADE, schema))
