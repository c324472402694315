"""postbox's schema: the outbox and the tables of the job system.

Everything is created in one schema (``postbox``, or ``POSTBOX_SCHEMA``), where
alembic keeps postbox's own version table too: nothing is created outside it.
``{schema}`` in the DDL is the schema name, quoted as an identifier by
:func:`postbox.schema.render`; other braces are doubled.

Revision ID: 0001_postbox
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0001_postbox"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE SCHEMA IF NOT EXISTS {schema};

-- Checked when a value is written (INSERT, or an UPDATE that sets the column),
-- not on every update of the row: PostgreSQL evaluates a table's CHECK
-- constraints on every UPDATE, and a job's row is updated three times (the
-- relay's mark, the claim, the outcome) without touching these columns.
CREATE DOMAIN {schema}.queue_name AS text CHECK (VALUE ~ '^[a-z0-9][a-z0-9_-]{{0,63}}$');
CREATE DOMAIN {schema}.task_name AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN {schema}.json_object AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');

CREATE TABLE {schema}.outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue           {schema}.queue_name NOT NULL,
    task            {schema}.task_name  NOT NULL,
    args            {schema}.json_object NOT NULL DEFAULT '{{}}'::jsonb,
    priority        smallint    NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9),
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN
                        ('pending','queued','running','retrying','succeeded','dead','cancelled','expired')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer     NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    available_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,            -- NULL = not (or no longer) published: the relay's work list
    publish_count   integer     NOT NULL DEFAULT 0,
    stream_id       text,                   -- entry id of the latest publish (transport detail, never identity)
    started_at      timestamptz,
    finished_at     timestamptz,
    expires_at      timestamptz,            -- not started by then: never runs (state expired)
    dedup_key       text,
    headers         {schema}.json_object NOT NULL DEFAULT '{{}}'::jsonb,
    timeout_seconds double precision CHECK (timeout_seconds IS NULL OR timeout_seconds > 0),
    claimed_by      text,                   -- worker id holding the current attempt
    lease_until     timestamptz,            -- the claim is live until then (renewed by heartbeats)
    cancel_requested_at timestamptz,
    keep_result     boolean     NOT NULL DEFAULT false,
    result          jsonb,
    result_expires_at timestamptz,
    last_error      text,
    last_error_class text,
    discarded_at    timestamptz             -- dead letter discarded by an operator (kept until purged)
);

-- The relay's scan: unpublished rows, in id order / by due time.  Partial, so it
-- holds only the (small) set of rows still waiting for a publish.
CREATE INDEX outbox_unpublished_id ON {schema}.outbox (id)
    WHERE published_at IS NULL AND state IN ('pending', 'retrying');
CREATE INDEX outbox_unpublished_due ON {schema}.outbox (available_at)
    WHERE published_at IS NULL AND state IN ('pending', 'retrying');
-- Published and unfinished: what the relay republishes after Redis loss.
CREATE INDEX outbox_inflight ON {schema}.outbox (id) WHERE state IN ('queued', 'running');
-- Dedup, scoped per queue; lives as long as the row does.
CREATE UNIQUE INDEX outbox_dedup ON {schema}.outbox (queue, dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX outbox_queue_state ON {schema}.outbox (queue, state);
-- The unfinished and dead rows by state: what queue counts (GET /api/v1/queues) read, a
-- small part of an outbox that is mostly finished jobs (~40 ms instead of a ~200 ms scan at 1M rows).
CREATE INDEX outbox_live_state ON {schema}.outbox (state, queue)
    WHERE state IN ('pending', 'queued', 'running', 'retrying', 'dead');
CREATE INDEX outbox_finished ON {schema}.outbox (finished_at) WHERE finished_at IS NOT NULL;
-- Retention: results past their TTL are cleared (jobs/retention.py).
CREATE INDEX outbox_result_expiry ON {schema}.outbox (result_expires_at) WHERE result_expires_at IS NOT NULL;

-- One row per attempt: the history the API and the dead letters show.
CREATE TABLE {schema}.job_attempts (
    -- No foreign key to the outbox: its check cost a lookup and a KEY SHARE lock per
    -- attempt; the statements that delete outbox rows delete their attempts too.
    outbox_id   bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker_id   text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    outcome     text,       -- succeeded, retry, dead, cancelled, lost (claim taken over), duplicate
    error_class text,
    error       text,
    traceback   text,       -- a failed attempt's, bounded (jobs/text.py)
    PRIMARY KEY (outbox_id, attempt)
);

-- Exactly-once database effects: the job id as the idempotency key.
CREATE TABLE {schema}.processed_jobs (
    outbox_id    bigint      PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX processed_jobs_at ON {schema}.processed_jobs (processed_at);

-- Queue control (pause/resume). A queue with no row is active.
CREATE TABLE {schema}.queues (
    name       {schema}.queue_name PRIMARY KEY,
    paused     boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Worker liveness registry; staleness is computed by the reader from last_seen.
CREATE TABLE {schema}.workers (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    queues      text[]      NOT NULL DEFAULT '{{}}',
    concurrency integer     NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    in_flight   integer     NOT NULL DEFAULT 0,
    processed   bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    stopped_at  timestamptz
);

-- Relay processes and who leads (for operators and the demo's display).
CREATE TABLE {schema}.relays (
    id         text        PRIMARY KEY,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    role       text        NOT NULL CHECK (role IN ('leader', 'standby', 'stopped')),
    term       bigint      NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now()
);

-- Every destructive operation, by whom and when.
CREATE TABLE {schema}.audit_log (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    action     text        NOT NULL,
    target     text        NOT NULL,
    request_id text,
    details    jsonb       NOT NULL DEFAULT '{{}}'::jsonb
);

-- Wake the relay when rows are committed. Statement level: one NOTIFY per
-- statement (and PostgreSQL folds identical ones per transaction), so bulk
-- inserts cost one notification.
CREATE FUNCTION {schema}.notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postbox_outbox', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_outbox();

-- The task definitions that workers and the API load (upserted when they start):
-- what postbox.enqueue() applies when SQL, a trigger or another language
-- enqueues without saying, as the Python enqueue() applies the @task defaults.
CREATE TABLE {schema}.tasks (
    name            {schema}.task_name  PRIMARY KEY,
    queue           {schema}.queue_name NOT NULL,
    priority        smallint    NOT NULL CHECK (priority BETWEEN 0 AND 9),
    max_attempts    integer     NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds double precision CHECK (timeout_seconds IS NULL OR timeout_seconds > 0),
    keep_result     boolean     NOT NULL,
    retry           jsonb       NOT NULL DEFAULT '{{}}'::jsonb,  -- base_delay, max_delay, jitter (unset: settings)
    updated_at      timestamptz NOT NULL DEFAULT now(),
    updated_by      text                                      -- the process that last published it
);

-- Enqueue from plain SQL (any language, or a trigger) in the caller's transaction:
-- SELECT postbox.enqueue('send_receipt', '{{"order_id": 1}}'). Every option left
-- NULL takes the task's definition (postbox.tasks), else the built-in default
-- (queue 'default', priority 5, 5 attempts, no timeout, result not kept);
-- explicit arguments win. Validated as the Python enqueue() validates.
CREATE FUNCTION {schema}.enqueue(
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

DOWNGRADE_OBJECTS = r"""
DROP FUNCTION IF EXISTS {schema}.enqueue(text, jsonb, text, integer, timestamptz, text, integer, jsonb, timestamptz,
                                         double precision, boolean, double precision);
DROP TABLE IF EXISTS {schema}.tasks, {schema}.audit_log, {schema}.relays, {schema}.workers, {schema}.queues,
                     {schema}.processed_jobs, {schema}.job_attempts, {schema}.outbox;
DROP FUNCTION IF EXISTS {schema}.notify_outbox();
DROP DOMAIN IF EXISTS {schema}.queue_name, {schema}.task_name, {schema}.json_object;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    # The version table lives in the schema too: alembic deletes its row after this
    # step, so the schema is emptied rather than dropped while that table remains.
    op.execute(render(DOWNGRADE_OBJECTS, context.config.attributes["schema"]))
