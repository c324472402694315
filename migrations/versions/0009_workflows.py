"""Workflows: jobs that wait for other jobs, released in the transaction that ends them.

``workflows`` holds one row per graph enqueued by ``postbox.enqueue_workflow()``
(postbox.workflow). Each of its jobs is an outbox row with ``workflow_id``; a job
with upstream jobs is inserted in the state ``waiting`` (the relay publishes
only ``pending`` and ``retrying`` rows, so its partial indexes stay as they are)
with ``waiting_on``, the number of counters it waits for.

``workflow_edges`` holds one row per dependency (parent, child) with its failure
policy: ``cancel`` (the child is cancelled when the parent ends dead, cancelled
or expired), ``run`` (it runs anyway) or ``record`` (it runs, and the parent's
failure is written on the edge for it to read). A child with at most 16 parents
counts them on its own row (``waiting_on``); one with more counts them in 16
rows of ``workflow_joins`` (its parents spread over them by position), and
``waiting_on`` counts those shards: a child finishing decrements one shard, and
only the child that empties a shard touches the waiting job's row. A fan-in of
10,000 jobs takes 16 locks on the join's row, not 10,000.

The release runs in the statement that ends the parent, by trigger, so it
commits with that outcome whichever statement wrote it (the worker's outcome
batch, ``record_success()`` inside a job's own transaction, a claim that finds
the attempts used up, the relay's expiry, an operator's cancel), and a stale
attempt, whose fenced UPDATE matches no row, releases nothing:

- ``outbox_workflow_ended`` (BEFORE UPDATE OF state, per row, only for a
  workflow's row entering a terminal state for the first time) stamps
  ``released_at`` in the row being written (no second write) and notes the id
  in the transaction-local setting ``postbox.workflow_ended``;
- ``outbox_workflow_release`` (AFTER UPDATE, per statement, only when that
  setting holds ids) counts down the noted jobs' dependents, locking counters
  and rows in key order with one statement and writing them with the next
  (whose snapshot, taken with the locks held, sees every committed count; two
  outcome batches never wait on each other in a cycle), releases those that
  reach zero (``waiting`` to ``pending``, and one NOTIFY to wake the relay),
  and cancels those whose policy says so; the jobs it cancels are noted in
  turn and handled by the same loop, so a cancellation runs down a chain
  without recursion.

docs/workflows.md.

Revision ID: 0009_workflows
Revises: 0008_sessions
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0009_workflows"
down_revision = "0008_sessions"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE {schema}.workflows (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    on_failure  text        NOT NULL DEFAULT 'cancel' CHECK (on_failure IN ('cancel', 'run', 'record')),
    jobs        integer     NOT NULL CHECK (jobs >= 1),
    created_at  timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz,
    retried_at  timestamptz
);

ALTER TABLE {schema}.outbox
    ADD COLUMN workflow_id bigint,       -- NULL: not part of a workflow
    ADD COLUMN waiting_on  integer,      -- while waiting: counters not yet at zero (parents, or shards of them)
    ADD COLUMN released_at timestamptz;  -- when this job's end was counted for its dependents
CREATE INDEX outbox_workflow ON {schema}.outbox (workflow_id, id) WHERE workflow_id IS NOT NULL;
-- The waiting jobs by queue (metrics, GET /api/v1/workflows counts): a small part of the outbox.
CREATE INDEX outbox_waiting ON {schema}.outbox (queue, workflow_id) WHERE state = 'waiting';

-- 'waiting': a workflow's job whose upstream jobs have not all ended. Checked without
-- a scan under an exclusive lock (NOT VALID), then validated under a weaker one.
ALTER TABLE {schema}.outbox DROP CONSTRAINT outbox_state_check;
ALTER TABLE {schema}.outbox ADD CONSTRAINT outbox_state_check CHECK (state IN
    ('pending','queued','running','retrying','succeeded','dead','cancelled','expired','waiting')) NOT VALID;
ALTER TABLE {schema}.outbox VALIDATE CONSTRAINT outbox_state_check;

CREATE TABLE {schema}.workflow_edges (
    parent_id   bigint   NOT NULL,
    child_id    bigint   NOT NULL,
    workflow_id bigint   NOT NULL,
    shard       smallint,            -- NULL: counted on the child's row (waiting_on)
    on_failure  text     NOT NULL CHECK (on_failure IN ('cancel', 'run', 'record')),
    failure     jsonb,               -- 'record' edges: the parent's failure, written when it ended
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX workflow_edges_child ON {schema}.workflow_edges (child_id);
CREATE INDEX workflow_edges_workflow ON {schema}.workflow_edges (workflow_id);

-- The shards of a wide join: how many of the parents counted in each have not ended.
CREATE TABLE {schema}.workflow_joins (
    job_id    bigint   NOT NULL,
    shard     smallint NOT NULL,
    remaining integer  NOT NULL,
    PRIMARY KEY (job_id, shard)
) WITH (fillfactor = 10);

CREATE FUNCTION {schema}.workflow_job_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.released_at := clock_timestamp();
    -- a failed job's id is noted negative: the release need not look its state up
    PERFORM set_config('postbox.workflow_ended',
                       coalesce(current_setting('postbox.workflow_ended', true), '') || TG_RELID || ':'
                       || CASE WHEN NEW.state = 'succeeded' THEN NEW.id ELSE -NEW.id END || ',', true);
    RETURN NEW;
END;
$$;

-- Generic plans: each statement below is planned once per connection, not at every call
-- (a custom plan for its arrays cost more than running it: ~0.7 ms a call, ~0.2 ms generic).
CREATE FUNCTION {schema}.workflow_release() RETURNS trigger LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    _prefix text := TG_RELID || ':';
    _noted text[];
    _others text;
    _ended bigint[];
    _failed bigint[];
    _doomed bigint[];
    _children bigint[];
    _shards smallint[];
    _counts integer[];
    _heads bigint[];
    _steps integer[];
    _released bigint;
    _set text;
BEGIN
    -- Assignments of set_config() are simple expressions (no statement run); the UPDATEs of
    -- the outbox below are made with 'postbox.workflow_busy' on, so their own statement
    -- trigger does not run: the jobs they end are noted and handled by this loop.
    LOOP
        _noted := string_to_array(rtrim(coalesce(current_setting('postbox.workflow_ended', true), ''), ','), ',');
        EXIT WHEN coalesce(cardinality(_noted), 0) = 0;
        SELECT array_agg(DISTINCT abs(v)) FILTER (WHERE v IS NOT NULL),
               array_agg(DISTINCT -v) FILTER (WHERE v < 0),
               string_agg(x, ',') FILTER (WHERE v IS NULL)
          INTO _ended, _failed, _others
          FROM (SELECT x, CASE WHEN starts_with(x, _prefix) THEN substr(x, length(_prefix) + 1)::int8 END AS v
                  FROM unnest(_noted) x) noted;
        -- another schema's outbox keeps its ids for its own trigger
        _set := set_config('postbox.workflow_ended', coalesce(_others || ',', ''), true);
        EXIT WHEN _ended IS NULL;

        _doomed := '{{}}';
        IF _failed IS NOT NULL THEN
            -- 'record' edges keep the failure of their parent
            UPDATE {schema}.workflow_edges e
               SET failure = jsonb_build_object('state', p.state, 'error_class', p.last_error_class,
                                                'error', p.last_error)
              FROM {schema}.outbox p
             WHERE e.parent_id = ANY(_failed) AND p.id = e.parent_id AND e.on_failure = 'record';
            -- 'cancel' edges of failed parents: their children are cancelled, not counted down
            _doomed := ARRAY(
                SELECT DISTINCT e.child_id FROM {schema}.workflow_edges e
                 WHERE e.parent_id = ANY(_failed) AND e.on_failure = 'cancel' ORDER BY 1);
        END IF;
        -- Rows are locked (in key order) by one statement and written by the next: the
        -- second's snapshot, taken once the locks are held, sees every committed count.
        IF cardinality(_doomed) > 0 THEN
            PERFORM 1 FROM {schema}.outbox WHERE id = ANY(_doomed) ORDER BY id FOR UPDATE;
            _set := set_config('postbox.workflow_busy', 'on', true);
            UPDATE {schema}.outbox
               SET state = 'cancelled', finished_at = clock_timestamp(), waiting_on = NULL,
                   last_error_class = 'UpstreamFailed',
                   last_error = 'an upstream job of this workflow ended dead, cancelled or expired'
             WHERE id = ANY(_doomed) AND state = 'waiting';  -- noted by the row trigger: handled next turn
            _set := set_config('postbox.workflow_busy', '', true);
        END IF;

        -- Count down: what each dependent gets, per shard (NULL: on its own row), read by the
        -- ended jobs' edges alone; then the shards of wide joins, then the waiting rows.
        SELECT array_agg(child_id ORDER BY child_id, shard), array_agg(shard ORDER BY child_id, shard),
               array_agg(n ORDER BY child_id, shard)
          INTO _children, _shards, _counts
          FROM (SELECT e.child_id, e.shard, count(*)::int AS n FROM {schema}.workflow_edges e
                 WHERE e.parent_id = ANY(_ended) AND e.child_id <> ALL(_doomed)
                 GROUP BY e.child_id, e.shard) counted;
        CONTINUE WHEN _children IS NULL;
        IF cardinality(_children) > 1 THEN  -- one row alone needs no order
            PERFORM 1 FROM {schema}.workflow_joins j
              JOIN unnest(_children, _shards) AS u(child, shard) ON j.job_id = u.child AND j.shard = u.shard
             ORDER BY j.job_id, j.shard
               FOR UPDATE OF j;
        END IF;
        WITH emptied AS (
            UPDATE {schema}.workflow_joins j SET remaining = j.remaining - u.n
              FROM unnest(_children, _shards, _counts) AS u(child, shard, n)
             WHERE j.job_id = u.child AND j.shard = u.shard
            RETURNING j.job_id, j.remaining
        ), steps AS (
            SELECT child AS job_id, n FROM unnest(_children, _shards, _counts) AS u(child, shard, n)
             WHERE shard IS NULL
            UNION ALL
            SELECT job_id, 1 FROM emptied WHERE remaining = 0
        )
        SELECT array_agg(job_id ORDER BY job_id), array_agg(n ORDER BY job_id) INTO _heads, _steps
          FROM (SELECT job_id, sum(n)::int AS n FROM steps GROUP BY job_id) s;
        IF _heads IS NOT NULL THEN
            IF cardinality(_heads) > 1 THEN
                PERFORM 1 FROM {schema}.outbox WHERE id = ANY(_heads) ORDER BY id FOR UPDATE;
            END IF;
            _set := set_config('postbox.workflow_busy', 'on', true);
            WITH released AS (
                UPDATE {schema}.outbox o
                   SET waiting_on = o.waiting_on - s.n,
                       state = CASE WHEN o.waiting_on - s.n <= 0 THEN 'pending' ELSE o.state END,
                       available_at = CASE WHEN o.waiting_on - s.n <= 0
                                           THEN greatest(o.available_at, clock_timestamp())
                                           ELSE o.available_at END
                  FROM unnest(_heads, _steps) AS s(id, n)
                 WHERE o.id = s.id AND o.state = 'waiting'
                RETURNING o.state
            )
            SELECT count(*) FILTER (WHERE state = 'pending') INTO _released FROM released;
            _set := set_config('postbox.workflow_busy', '', true);
            IF _released > 0 THEN
                PERFORM pg_notify('postbox_outbox', '');
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_workflow_ended BEFORE UPDATE OF state ON {schema}.outbox FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND NEW.released_at IS NULL
          AND NEW.state IN ('succeeded', 'dead', 'cancelled', 'expired'))
    EXECUTE FUNCTION {schema}.workflow_job_ended();
CREATE TRIGGER outbox_workflow_release AFTER UPDATE ON {schema}.outbox FOR EACH STATEMENT
    WHEN (current_setting('postbox.workflow_ended', true) > ''
          AND current_setting('postbox.workflow_busy', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION {schema}.workflow_release();
"""

DOWNGRADE = r"""
DROP TRIGGER outbox_workflow_release ON {schema}.outbox;
DROP TRIGGER outbox_workflow_ended ON {schema}.outbox;
DROP FUNCTION {schema}.workflow_release();
DROP FUNCTION {schema}.workflow_job_ended();
DROP TABLE {schema}.workflow_joins, {schema}.workflow_edges, {schema}.workflows;
-- A waiting job cannot be expressed without workflows: it is cancelled.
UPDATE {schema}.outbox SET state = 'cancelled', finished_at = now(),
       last_error_class = 'WorkflowsRemoved', last_error = 'its workflow was removed by a schema downgrade'
 WHERE state = 'waiting';
ALTER TABLE {schema}.outbox DROP CONSTRAINT outbox_state_check;
ALTER TABLE {schema}.outbox ADD CONSTRAINT outbox_state_check CHECK (state IN
    ('pending','queued','running','retrying','succeeded','dead','cancelled','expired'));
DROP INDEX {schema}.outbox_workflow, {schema}.outbox_waiting;
ALTER TABLE {schema}.outbox DROP COLUMN workflow_id, DROP COLUMN waiting_on, DROP COLUMN released_at;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
