"""Every statement on the outbox (and its side tables), named, parameters only.

One place per table: producers, the relay, workers and the API all take their
SQL from here, so a reader sees every way a row can change in one file.
Statements are ``LiteralString`` so a type checker refuses SQL built at runtime.

A statement is named for what it does to which table, never for its caller:
``<TABLE>_<EFFECT>``, with ``JOB_`` for the outbox (``JOB_CLAIM_ATTEMPTS``,
``JOB_RECORD_OUTCOMES``, ``JOB_HAND_BACK``), ``JOB_ATTEMPT_`` for job_attempts,
``PROCESSED_``, ``TASK_``, ``LEADER_`` / ``RELAY_``, ``WORKER_``, ``QUEUE_``,
``LIMIT_`` (limits, limit_slots, limit_rates), ``SCHEDULE_`` / ``SCHEDULE_RUN_``,
``AUDIT_``, ``MIGRATION_``; ``GET`` / ``LIST`` / ``COUNT`` read, ``LOCK`` reads
``FOR UPDATE``. Callers that do the same thing to a table share one statement.

Sections, one per table (the outbox's by component): outbox (enqueue; publish
and republish; claims and outcomes; claims released unrun; flow control; reads
and operator actions), job_attempts, processed_jobs, retention, tasks, relays
and leadership, workers, queues, limits, schedules, audit_log, alembic_version,
and statements on no table (notifications, the clock). Fragments that several
statements share (the release of a claim, the lost attempt it ends) are written
once, above the class, and joined when the class is defined.

Every table is named with its schema, ``{schema}.outbox``: postbox's objects
live in one schema of their own (``POSTBOX_SCHEMA``, default ``postbox``), and a
statement must find them whatever the ``search_path`` of the connection it runs
on (a user's connection, when enqueueing). :func:`active` gives the statements
rendered for the process's schema; the name goes in through
``psycopg.sql.Identifier`` (see :mod:`postbox.schema`), once per schema.
"""

from __future__ import annotations

import functools
from typing import LiteralString

from postbox import schema

# The SQLSTATE of a refused fence inside a handler's transaction (migration 0005's
# require_current_attempt(), called by 0006's record_success(); JOB_RECORD_SUCCESS).
STALE_ATTEMPT_SQLSTATE = "PB001"


# --- shared fragments -------------------------------------------------------------------------
# Pieces that several statements below write the same way, written once. They are joined
# when the class is defined (LiteralString + LiteralString stays a LiteralString); the
# result is a template like any other, rendered per schema by postbox.schema.Templates.


def _release_claims(
    *, where: LiteralString, also_select: LiteralString = "", also_set: LiteralString = ""
) -> LiteralString:
    """The CTEs ``target``, ``released`` and ``lost`` of a statement that gives rows back unrun.

    ``target``: the outbox rows matching ``where``, locked in id order (as every claim
    locks them), with what their claim was (``also_select`` adds columns).
    ``released``: those rows pending again, unclaimed and unpublished, so the relay
    publishes them again when due (``also_set`` adds assignments; ``t`` is the target
    row); returns their ids. ``lost``: the attempt of a row that was running under a
    stale claim ends as lost in job_attempts (it stays counted); written once: a row
    its worker wrote at its start (an isolated run, JOB_ATTEMPT_START_ISOLATED) is
    finished, a finished one left alone.
    """
    return (
        """
    WITH target AS (
        SELECT id, state AS old_state, attempts, claimed_by AS old_worker, started_at AS old_started_at"""
        + also_select
        + """
          FROM {schema}.outbox
         WHERE """
        + where
        + """
         ORDER BY id
           FOR UPDATE
    ), released AS (
        UPDATE {schema}.outbox o
           SET state = 'pending', published_at = NULL, claimed_by = NULL, lease_until = NULL"""
        + also_set
        + """
          FROM target t
         WHERE o.id = t.id
     RETURNING o.id
    ), lost AS (
        INSERT INTO {schema}.job_attempts AS a (outbox_id, attempt, worker_id, started_at, finished_at, outcome)
        SELECT id, attempts, old_worker, coalesce(old_started_at, now()), now(), 'lost'
          FROM target WHERE old_state = 'running'
        ON CONFLICT (outbox_id, attempt) DO UPDATE SET finished_at = now(), outcome = 'lost'
         WHERE a.finished_at IS NULL
    )"""
    )


# The answer of a hand-back or hold-back: (id, true) for each row released, (id, false)
# for each row of %(ids)s that is due but whose publish is not marked yet (the relay
# adds the entry, then marks the row: a release written before the mark would be
# overwritten by it, so the entry stays pending for a later look).
_RELEASED_OR_UNMARKED: LiteralString = """
    SELECT id, true FROM released
    UNION ALL
    SELECT id, false FROM {schema}.outbox
     WHERE id = ANY(%(ids)s::int8[]) AND state IN ('pending', 'retrying') AND published_at IS NULL
       AND available_at <= now()
    """


class Statements(schema.Templates):
    """The statements as templates (class attributes) and, on an instance, rendered for one schema."""

    # --- outbox: enqueue (postbox.producer, the SQL function, the API, postbox.ids) ---------------

    JOB_INSERT: LiteralString = """
    INSERT INTO {schema}.outbox (queue, task, args, priority, available_at, max_attempts, dedup_key, headers,
                        expires_at, timeout_seconds, keep_result, unique_key)
    VALUES (%(queue)s, %(task)s, %(args)s::jsonb, %(priority)s,
            coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
            %(max_attempts)s, %(dedup_key)s, %(headers)s::jsonb,
            %(expires_at)s::timestamptz, %(timeout)s::float8, %(keep_result)s, %(unique_key)s)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id
    """

    # The same row with an id drawn ahead (jobs/ids.py): what a pipelined enqueue
    # sends, and needs no reply for. Only for jobs without a dedup key.
    JOB_INSERT_WITH_ID: LiteralString = """
    INSERT INTO {schema}.outbox (id, queue, task, args, priority, available_at, max_attempts, headers,
                        expires_at, timeout_seconds, keep_result)
    OVERRIDING SYSTEM VALUE
    VALUES (%(id)s, %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s,
            coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
            %(max_attempts)s, %(headers)s::jsonb, %(expires_at)s::timestamptz, %(timeout)s::float8,
            %(keep_result)s)
    """

    # One job inserted and read back in one statement (the REST enqueue's fast path,
    # app/api/routes_jobs.py: no dedup key, no unique rule, no depth limit): the
    # columns of JOB_GET, as the row was inserted.
    JOB_INSERT_RETURNING_JOB: LiteralString = """
    WITH inserted AS (
        INSERT INTO {schema}.outbox (queue, task, args, priority, available_at, max_attempts, headers,
                            expires_at, timeout_seconds, keep_result)
        VALUES (%(queue)s, %(task)s, %(args)s::jsonb, %(priority)s,
                coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
                %(max_attempts)s, %(headers)s::jsonb, %(expires_at)s::timestamptz, %(timeout)s::float8,
                %(keep_result)s)
        RETURNING *
    )
    SELECT id, queue, task, priority, state, attempts, max_attempts, created_at, available_at, published_at,
           started_at, finished_at, expires_at, cancel_requested_at, discarded_at, dedup_key, keep_result,
           last_error_class, last_error, claimed_by, args, result, progress
      FROM inserted
    """

    JOB_INSERT_MANY: LiteralString = """
    INSERT INTO {schema}.outbox (queue, task, args, priority, available_at, max_attempts, dedup_key, headers,
                        expires_at, timeout_seconds, keep_result)
    SELECT q, t, a::jsonb, p, coalesce(r, now() + make_interval(secs => d)), m, k, h::jsonb, e, tmo, kr
      FROM unnest(%(queue)s::text[], %(task)s::text[], %(args)s::text[], %(priority)s::int2[],
                  %(run_at)s::timestamptz[], %(delay)s::float8[], %(max_attempts)s::int4[],
                  %(dedup_key)s::text[], %(headers)s::text[], %(expires_at)s::timestamptz[],
                  %(timeout)s::float8[], %(keep_result)s::bool[])
           AS u(q, t, a, p, r, d, m, k, h, e, tmo, kr)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id, queue, dedup_key
    """

    # Bulk without dedup keys goes by COPY (about twice as fast as INSERT ... SELECT):
    # the ids are drawn first, so they come back in input order, and the
    # statement-level NOTIFY trigger fires for COPY as for INSERT.
    JOB_NEXT_IDS: LiteralString = """
    SELECT nextval(pg_get_serial_sequence('{schema}.outbox', 'id')), now() FROM generate_series(1, %(n)s)
    """

    # fair_key: a fair queue's key, when the producer knows the declaration (postbox.fairness);
    # NULL otherwise (the relay keys the row).
    JOB_COPY_MANY: LiteralString = """
    COPY {schema}.outbox (id, queue, task, args, priority, available_at, max_attempts, headers,
                 expires_at, timeout_seconds, keep_result, fair_key) FROM STDIN
    """

    # Another driver's connection (psycopg2, asyncpg, pg8000 under SQLAlchemy; Django
    # on psycopg2): the job, validated in Python, is written by the SQL function in
    # that connection's transaction. The same call in SQLAlchemy's bind style and in
    # DB-API pyformat; the parameters are JobRow.params().
    JOB_ENQUEUE_FUNCTION_SQLALCHEMY: LiteralString = """
    SELECT {schema}.enqueue(
        task => CAST(:task AS text), args => CAST(:args AS jsonb), queue => CAST(:queue AS text),
        priority => CAST(:priority AS integer), run_at => CAST(:run_at AS timestamptz),
        dedup_key => CAST(:dedup_key AS text), max_attempts => CAST(:max_attempts AS integer),
        headers => CAST(:headers AS jsonb), expires_at => CAST(:expires_at AS timestamptz),
        timeout_seconds => CAST(:timeout AS float8), keep_result => CAST(:keep_result AS boolean),
        delay_seconds => CAST(:delay AS float8))
    """

    JOB_ENQUEUE_FUNCTION_PYFORMAT: LiteralString = """
    SELECT {schema}.enqueue(
        task => %(task)s::text, args => %(args)s::jsonb, queue => %(queue)s::text,
        priority => %(priority)s::integer, run_at => %(run_at)s::timestamptz,
        dedup_key => %(dedup_key)s::text, max_attempts => %(max_attempts)s::integer,
        headers => %(headers)s::jsonb, expires_at => %(expires_at)s::timestamptz,
        timeout_seconds => %(timeout)s::float8, keep_result => %(keep_result)s::boolean,
        delay_seconds => %(delay)s::float8)
    """

    # A unique task's job (jobs/unique.py): its key, and the job holding that key
    # (NULL: none). Takes the key's advisory lock until the transaction ends, so a
    # concurrent enqueuer of the key waits, then finds this one's job.
    JOB_LOCK_UNIQUE_KEY: LiteralString = """
    SELECT unique_key, holder FROM {schema}.unique_claim(%(task)s, %(args)s::jsonb, %(unique_rule)s::jsonb)
    """

    JOB_GET_BY_DEDUP_KEY: LiteralString = """
    SELECT id FROM {schema}.outbox WHERE queue = %(queue)s AND dedup_key = %(dedup_key)s
    """

    JOB_GET_MANY_BY_DEDUP_KEY: LiteralString = """
    SELECT id, queue, dedup_key FROM {schema}.outbox
     WHERE (queue, dedup_key) IN (SELECT * FROM unnest(%(queue)s::text[], %(dedup_key)s::text[]))
    """

    # Waiting jobs of one queue, counted no further than the limit (cheap at any depth).
    JOB_COUNT_WAITING: LiteralString = """
    SELECT count(*) FROM (
        SELECT 1 FROM {schema}.outbox
         WHERE queue = %(queue)s AND state IN ('pending', 'queued', 'retrying') LIMIT %(limit)s
    ) AS waiting
    """

    # --- outbox: publish and republish (postbox.relay) --------------------------------------------
    # Every statement the relay runs as leader runs on the leader's own session (the one
    # holding the advisory lock), so a lost session cannot mark anything.

    # Due, unpublished rows, highest priority first, then in id order (0021's index).
    # Never a "last id" cursor: a transaction that commits late carries a lower id,
    # and this scan still finds it. Inside one burst the cursor (``after_priority``,
    # ``after_id``: the last row of the batch still being marked) skips that batch;
    # outside, it is (10, 0), above every priority. The cursor is two ranges of the
    # index, the rest of its priority and the priorities below, so that a scan
    # starts where the cursor is rather than at the top (where a burst leaves the
    # batches it marked: one condition with an OR, a filter, cost a drain of
    # 200,000 jobs a fifth of its rate; docs/benchmarks.md, twenty-sixth round).
    # A fair queue's rows leave this list once the relay gave them their key
    # (JOB_SET_FAIR_KEY); the fair queue's window takes them (JOB_GET_FAIR_DUE).
    # ``held``: rows already sent whose mark the relay holds back (relay/publisher.py).
    _DUE_UNPUBLISHED: LiteralString = """
        SELECT id, queue, task, args::text, headers::text, priority, attempts,
               (extract(epoch FROM created_at) * 1000)::int8 AS enq_ms,
               coalesce(expires_at < now(), false) AS expired
          FROM {schema}.outbox
         WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
           AND fair_key IS NULL AND id <> ALL(%(held)s::int8[])"""
    JOB_GET_DUE_UNPUBLISHED: LiteralString = (
        "SELECT * FROM (("
        + _DUE_UNPUBLISHED
        + """
           AND priority = %(after_priority)s AND id > %(after_id)s
         ORDER BY priority DESC, id
         LIMIT %(limit)s)
        UNION ALL ("""
        + _DUE_UNPUBLISHED
        + """
           AND priority < %(after_priority)s
         ORDER BY priority DESC, id
         LIMIT %(limit)s)
    ) AS due
     ORDER BY priority DESC, id
     LIMIT %(limit)s
    """
    )

    # One statement for the whole batch; a row a worker already claimed (it set
    # published_at) is left alone. The term is checked first, in the same statement:
    # if a newer leader has been recorded, nothing is marked and ``leads`` is false.
    # %(term)s is NULL for tools that publish without the lock (publish_once, drain).
    # The rows are locked first, in id order, as a worker's claim locks them: an
    # UPDATE alone locks rows in whatever order its plan visits them (a hash join
    # probing the heap goes in physical order, as it does when the statistics were
    # taken at another size, e.g. before a TRUNCATE), and a claim holding the lower
    # id while the mark holds a higher one is a deadlock: a second of waiting, then
    # the relay's session (its leadership) or the worker's claim (its entries wait
    # for the visibility timeout) is cancelled. The locked rows are then updated by
    # ctid (a TID scan, whatever the statistics say). A row updated in between (a
    # worker's claim) fails the lock's recheck and is skipped, which is what we want.
    # The rows are found by primary key only (IS TRUE, as in JOB_CLAIM_ATTEMPTS): the
    # unpublished index, with a backlog and the entries updates leave until autovacuum,
    # made a 1,000-row mark over a 25,000-row backlog take 37-74 ms; 10 ms by primary key.
    #
    # The statement is the body of mark_published() (migration 0013), planned once per
    # connection as the claim is: a one-row mark planned again at every run spent more
    # on planning than on running. The row it returns also answers JOB_NEXT_DUE, so
    # that an idle relay need not ask it separately: (leads, marked, next_due).
    # ``attempts`` are the rows' counts as selected: a row claimed since (run, then
    # retrying: unpublished again, for its next attempt) is not marked (migration 0015).
    JOB_MARK_PUBLISHED: LiteralString = """
    SELECT leads, marked, next_due
      FROM {schema}.mark_published(%(ids)s::int8[], %(sids)s::text[], %(term)s::int8, %(attempts)s::int4[])
    """

    # The planner's estimate of the unpublished rows. Right after a bulk load it can
    # be ~0 while a huge backlog waits (statistics from an emptier table); then it
    # hashes or bitmap-scans the whole backlog for every batch's mark. The relay
    # compares this estimate with a full batch it just read and ANALYZEs if it is low.
    JOB_ESTIMATE_UNPUBLISHED: LiteralString = """
    EXPLAIN (FORMAT JSON) SELECT 1 FROM {schema}.outbox WHERE published_at IS NULL AND state IN ('pending', 'retrying')
    """

    JOB_ANALYZE: LiteralString = "ANALYZE {schema}.outbox"

    # Locked in id order first, like the marks above.
    JOB_MARK_EXPIRED: LiteralString = """
    WITH locked AS MATERIALIZED (
        SELECT ctid FROM {schema}.outbox
         WHERE id = ANY(%(ids)s::int8[]) AND published_at IS NULL AND state IN ('pending', 'retrying')
           AND expires_at < now()
         ORDER BY id
           FOR UPDATE
    )
    UPDATE {schema}.outbox SET state = 'expired', finished_at = now()
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM locked))
    """

    # Seconds until the next delayed row is due (NULL: none waiting).
    JOB_NEXT_DUE: LiteralString = """
    SELECT extract(epoch FROM min(available_at) - now())::float8
      FROM {schema}.outbox
     WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at > now()
    """

    JOB_COUNT_BACKLOG: LiteralString = """
    SELECT count(*), coalesce(extract(epoch FROM now() - min(available_at))::float8, 0)
      FROM {schema}.outbox
     WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
    """

    # After Redis lost its data: rows published before the loss was noticed and not
    # finished (queued, or running under a claim that went stale), by id from a cursor.
    JOB_GET_PUBLISHED_UNFINISHED: LiteralString = """
    SELECT id, queue, task, args::text, headers::text, priority, attempts,
           (extract(epoch FROM created_at) * 1000)::int8 AS enq_ms
      FROM {schema}.outbox
     WHERE id > %(after)s
       AND ((state = 'queued' AND published_at <= %(cutoff)s)
            OR (state = 'running' AND lease_until < now()))
     ORDER BY id
     LIMIT %(limit)s
    """

    # Candidates for the "is its entry still there" sweep: published rows without an
    # outcome that have waited a while (queued), or whose claim went stale (running).
    # A running row that names no entry (claimed from a worker's parking, or before the
    # claim recorded its entry) has none that could bring it back: it is a candidate too.
    JOB_GET_INFLIGHT: LiteralString = """
    SELECT id, queue, task, args::text, headers::text, priority, attempts,
           (extract(epoch FROM created_at) * 1000)::int8 AS enq_ms, stream_id
      FROM {schema}.outbox
     WHERE id > %(after)s
       AND ((state = 'queued' AND stream_id IS NOT NULL
             AND published_at < now() - make_interval(secs => %(min_age)s))
            OR (state = 'running' AND lease_until < now()))
     ORDER BY id
     LIMIT %(limit)s
    """

    # The stream entries of the newest in-flight rows (by id, through the outbox_inflight
    # index): a new leader's high-water marks, so a failover that lost the tail of a
    # stream before this term began is still noticed (relay/watermark.py).
    JOB_GET_RECENT_STREAM_IDS: LiteralString = """
    SELECT queue, priority, stream_id
      FROM (SELECT queue, priority, stream_id FROM {schema}.outbox
             WHERE state IN ('queued', 'running')
             ORDER BY id DESC
             LIMIT %(limit)s) recent
     WHERE stream_id IS NOT NULL
    """

    # The rows of a republish that still have no outcome, re-read right before the XADD.
    JOB_GET_STILL_UNFINISHED: LiteralString = """
    SELECT id FROM {schema}.outbox
     WHERE id = ANY(%(ids)s::int8[])
       AND (state = 'queued' OR (state = 'running' AND lease_until < now()))
    """

    # Record a republish; only a row still without an outcome is touched. Locked in
    # id order first, like JOB_MARK_PUBLISHED (and for the same reason).
    JOB_MARK_REPUBLISHED: LiteralString = """
    WITH lead AS (
        SELECT %(term)s::int8 IS NULL OR coalesce(max(term), 0) <= %(term)s::int8 AS leads FROM {schema}.relays
    ), locked AS MATERIALIZED (
        SELECT ctid FROM {schema}.outbox
         WHERE (SELECT leads FROM lead) AND id = ANY(%(ids)s::int8[]) AND state IN ('queued', 'running')
         ORDER BY id
           FOR UPDATE
    ), marked AS (
        UPDATE {schema}.outbox AS o
           SET published_at = CASE WHEN o.state = 'queued' THEN now() ELSE o.published_at END,
               publish_count = o.publish_count + 1, stream_id = u.sid
          FROM unnest(%(ids)s::int8[], %(sids)s::text[]) AS u(id, sid)
         WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM locked)) AND o.id = u.id
        RETURNING 1
    )
    SELECT (SELECT leads FROM lead), (SELECT count(*) FROM marked)
    """

    # --- fair_queues, outbox.fair_key: fair queues (relay/fairness.py; docs/job-control.md) --------

    FAIR_QUEUE_LIST: LiteralString = """
    SELECT queue, key_arg, window_size FROM {schema}.fair_queues ORDER BY queue
    """

    FAIR_QUEUE_GET: LiteralString = """
    SELECT queue, key_arg, window_size, updated_at, updated_by FROM {schema}.fair_queues WHERE queue = %(queue)s
    """

    # Returns the key argument it replaced (NULL: the queue was not fair), as the
    # statement's snapshot saw it (a locking read would skip the row this statement updates).
    FAIR_QUEUE_UPSERT: LiteralString = """
    WITH old AS (SELECT key_arg FROM {schema}.fair_queues WHERE queue = %(queue)s)
    INSERT INTO {schema}.fair_queues AS f (queue, key_arg, window_size, updated_by)
    VALUES (%(queue)s, %(by)s, %(window)s, %(actor)s)
    ON CONFLICT (queue) DO UPDATE
       SET key_arg = excluded.key_arg, window_size = excluded.window_size, updated_at = now(),
           updated_by = excluded.updated_by
    RETURNING (SELECT key_arg FROM old)
    """

    FAIR_QUEUE_DELETE: LiteralString = """
    DELETE FROM {schema}.fair_queues WHERE queue = %(queue)s RETURNING key_arg
    """

    # A fair queue's key argument changed: its keyed, unfinished jobs take their new key.
    JOB_REKEY_FAIR: LiteralString = """
    UPDATE {schema}.outbox SET fair_key = coalesce(args ->> %(by)s::text, '')
     WHERE queue = %(queue)s AND fair_key IS NOT NULL AND state IN ('pending', 'queued', 'running', 'retrying')
       AND fair_key IS DISTINCT FROM coalesce(args ->> %(by)s::text, '')
    """

    # A queue is fair no more (or its declaration is gone): its unfinished jobs lose their
    # keys, so the waiting ones are in the relay's id-ordered list again. ``queue`` NULL:
    # every queue without a declaration (the relay's safety net, e.g. a job moved to
    # another queue while it waited).
    # (Written as the two partial indexes' predicates, so it reads them, never the table.)
    JOB_CLEAR_FAIR_KEYS: LiteralString = """
    UPDATE {schema}.outbox o SET fair_key = NULL
     WHERE o.fair_key IS NOT NULL
       AND ((o.published_at IS NULL AND o.state IN ('pending', 'retrying')) OR o.state IN ('queued', 'running'))
       AND (o.queue = %(queue)s::text
            OR (%(queue)s::text IS NULL
                AND NOT EXISTS (SELECT 1 FROM {schema}.fair_queues f WHERE f.queue = o.queue)))
    """

    # The rows of fair queues among a batch the relay selected: each takes its key (the
    # declared argument's value as text, '' without it) and leaves the id-ordered list.
    # Rows a fair queue's window already has (keyed before: a batch that came with its
    # notifications is older than the relay's last look at the newest rows, which may
    # have keyed them) are returned too, unlocked: they must not be published here either.
    # Rows of queues not (or no longer) fair are not returned: the relay publishes them.
    # Locked in id order first, like the marks. (The last SELECT reads the rows as they
    # were before the UPDATE: a row keyed now is returned once, by ``keyed``.)
    JOB_SET_FAIR_KEY: LiteralString = """
    WITH locked AS MATERIALIZED (
        SELECT o.ctid FROM {schema}.outbox o
         WHERE o.id = ANY(%(ids)s::int8[]) AND o.published_at IS NULL AND o.state IN ('pending', 'retrying')
           AND o.fair_key IS NULL AND o.queue IN (SELECT f.queue FROM {schema}.fair_queues f)
         ORDER BY o.id
           FOR UPDATE
    ), keyed AS (
        UPDATE {schema}.outbox o
           SET fair_key = coalesce(o.args ->> (SELECT f.key_arg FROM {schema}.fair_queues f
                                                WHERE f.queue = o.queue), '')
         WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM locked))
        RETURNING o.id
    )
    SELECT id FROM keyed
    UNION ALL
    SELECT o.id FROM {schema}.outbox o
     WHERE o.id = ANY(%(ids)s::int8[]) AND o.fair_key IS NOT NULL
       AND o.queue IN (SELECT f.queue FROM {schema}.fair_queues f)
    """

    # The same for the rows of fair queues among the newest ``scan`` unkeyed waiting rows
    # (the relay's list read backwards): a key that starts waiting behind another's
    # backlog just enqueued is keyed at once, not after the backlog. Rows a producer or
    # a claim holds are skipped (keyed on a later pass).
    JOB_SET_FAIR_KEY_NEWEST: LiteralString = """
    WITH newest AS (
        SELECT id, queue FROM {schema}.outbox
         WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND fair_key IS NULL
         ORDER BY id DESC
         LIMIT %(scan)s
    ), locked AS MATERIALIZED (
        SELECT o.ctid FROM {schema}.outbox o
         WHERE o.id IN (SELECT n.id FROM newest n WHERE n.queue IN (SELECT f.queue FROM {schema}.fair_queues f))
           AND o.published_at IS NULL AND o.state IN ('pending', 'retrying') AND o.fair_key IS NULL
         ORDER BY o.id
           FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.outbox o
       SET fair_key = coalesce(o.args ->> (SELECT f.key_arg FROM {schema}.fair_queues f WHERE f.queue = o.queue), '')
     WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM locked))
    RETURNING o.queue
    """

    # One fill of a fair queue's window, in one statement: the jobs in flight per key
    # (outbox_fair_inflight), the room the window leaves, and up to that many due jobs,
    # keys in turn: each key's jobs in its own order (priority, then id), ranked 1, 2,
    # 3 ... after the jobs it already has in flight; the lowest turns first. A key with
    # nothing in flight goes first, and one with k in flight waits until the others have
    # k too (max-min fair shares). Keys are found by a skip scan of outbox_fair_waiting
    # (one probe per key); each key offers at most ``room`` jobs, fewer when many keys
    # wait (about 20,000 candidates in all). Always one row at least: the room and the
    # jobs in flight, with NULL job columns when there is no job to publish.
    JOB_GET_FAIR_DUE: LiteralString = """
    WITH RECURSIVE busy AS MATERIALIZED (
        SELECT fair_key AS k, count(*) AS n FROM {schema}.outbox
         WHERE queue = %(queue)s AND fair_key IS NOT NULL AND state IN ('queued', 'running')
         GROUP BY fair_key
    ), room AS MATERIALIZED (
        SELECT greatest(0, %(window)s::int8 - coalesce((SELECT sum(n) FROM busy), 0))::int8 AS n,
               coalesce((SELECT sum(n) FROM busy), 0)::int8 AS in_flight
    ), keys AS (
        (SELECT o.fair_key AS k FROM {schema}.outbox o
          WHERE (SELECT n FROM room) > 0
            AND o.queue = %(queue)s AND o.fair_key IS NOT NULL AND o.published_at IS NULL
            AND o.state IN ('pending', 'retrying')
          ORDER BY o.fair_key LIMIT 1)
        UNION ALL
        SELECT (SELECT o.fair_key FROM {schema}.outbox o
                 WHERE o.queue = %(queue)s AND o.fair_key > keys.k AND o.published_at IS NULL
                   AND o.state IN ('pending', 'retrying')
                 ORDER BY o.fair_key LIMIT 1)
          FROM keys WHERE keys.k IS NOT NULL
    ), live AS MATERIALIZED (
        SELECT k FROM keys WHERE k IS NOT NULL
    ), offer AS (
        SELECT least((SELECT n FROM room), greatest(1, 20000 / greatest(1, (SELECT count(*) FROM live)))) AS n
    ), picked AS (
        SELECT c.id, c.queue, c.task, c.args::text AS args, c.headers::text AS headers, c.priority, c.attempts,
               c.enq_ms, c.expired
          FROM live
          LEFT JOIN busy ON busy.k = live.k
         CROSS JOIN LATERAL (
               SELECT w.*, row_number() OVER (ORDER BY w.priority DESC, w.id) AS rn
                 FROM (SELECT o.id, o.queue, o.task, o.args, o.headers, o.priority, o.attempts,
                              (extract(epoch FROM o.created_at) * 1000)::int8 AS enq_ms,
                              coalesce(o.expires_at < now(), false) AS expired
                         FROM {schema}.outbox o
                        WHERE o.queue = %(queue)s AND o.fair_key = live.k AND o.published_at IS NULL
                          AND o.state IN ('pending', 'retrying') AND o.available_at <= now()
                        ORDER BY o.priority DESC, o.id
                        LIMIT (SELECT n FROM offer)) w) c
         ORDER BY coalesce(busy.n, 0) + c.rn, c.priority DESC, c.id
         LIMIT (SELECT n FROM room)
    )
    SELECT p.id, p.queue, p.task, p.args, p.headers, p.priority, p.attempts, p.enq_ms, p.expired,
           r.n AS room, r.in_flight
      FROM room r LEFT JOIN picked p ON true
    """

    # What an operator sees of a fair queue: per key, jobs waiting (due or not) and in
    # flight, the most waiting first.
    JOB_COUNT_FAIR_KEYS: LiteralString = """
    SELECT fair_key,
           count(*) FILTER (WHERE published_at IS NULL AND state IN ('pending', 'retrying')) AS waiting,
           count(*) FILTER (WHERE state IN ('queued', 'running')) AS in_flight
      FROM {schema}.outbox
     WHERE queue = %(queue)s AND fair_key IS NOT NULL AND state IN ('pending', 'queued', 'running', 'retrying')
     GROUP BY fair_key
     ORDER BY waiting DESC, fair_key
     LIMIT %(limit)s
    """

    # A fair queue's jobs waiting for its window and in flight, over every key.
    JOB_COUNT_FAIR_TOTALS: LiteralString = """
    SELECT count(*) FILTER (WHERE published_at IS NULL AND state IN ('pending', 'retrying')),
           count(*) FILTER (WHERE state IN ('queued', 'running'))
      FROM {schema}.outbox
     WHERE queue = %(queue)s AND fair_key IS NOT NULL AND state IN ('pending', 'queued', 'running', 'retrying')
    """

    # Jobs of a fair queue not keyed yet (enqueued since the relay last looked).
    JOB_COUNT_FAIR_UNKEYED: LiteralString = """
    SELECT count(*) FROM {schema}.outbox
     WHERE queue = %(queue)s AND fair_key IS NULL AND published_at IS NULL AND state IN ('pending', 'retrying')
    """

    # --- outbox: claims and outcomes (postbox.worker, postbox.testing) ----------------------------
    # The claim and outcome rules are the cross-component contract: a delivery runs
    # only if its row is claimable; only the claimant of the current attempt (the
    # fence: claimed_by, attempts, state) may record the outcome.

    # Claim a batch of deliveries. Rows are locked in id order (no deadlock between
    # two workers claiming overlapping batches) and re-checked after any lock wait.
    # The verdict: run it, or end it at once (expired; attempts used up by lost runs).
    #
    # A crash is charged to the job that caused it. Taking over a run whose lease
    # went stale (its worker died or froze): if that run was running alone (its
    # worker wrote the attempt's row when it started it, JOB_ATTEMPT_START_ISOLATED), the
    # crash is its own: the attempt is recorded lost and counted. Otherwise it may
    # have died for another job's crash: the attempt is recorded lost with error
    # class 'Interrupted' and not charged (it is counted in ``attempts``, and the
    # claim returns a budget one larger for each such run: ``max_attempts`` plus
    # the interrupted runs of this life; last_error says so), and the new run is
    # isolated (returned ``isolate``: the worker runs it alone, so a crash then is
    # its own). Never for a worker taking over its own run: the fence must tell the
    # two runs apart.
    #
    # ``entries`` (aligned with ``ids``; NULL for a delivery with no stream entry) are
    # the stream entries the claimed deliveries came in: a run's row names the entry
    # pending in its worker's consumer, or none (a job taken from its parking, an inline
    # run), which is what recovers the run if the worker dies. A claim can commit before
    # the relay's mark of the same publish (the mark then skips the row): without this,
    # the row named no entry (a first publish) or an older one, and once its worker died
    # and Redis lost the entry, the relay's sweep (JOB_GET_INFLIGHT) could not see that
    # the entry was gone: the job stayed running.
    #
    # The statement is the body of claim_attempts() (migration 0013), which PostgreSQL
    # plans once per connection (plan_cache_mode = force_generic_plan, for the function
    # only). As a prepared statement it was planned again at every run whenever the
    # statistics favoured custom plans, as they do over a backlog of claimable rows, and
    # planning was most of a one-row claim's cost (docs/benchmarks.md, "Plans kept per
    # connection").
    # A generic plan cannot see the ids, so the state condition is wrapped in IS TRUE
    # (the same rows: WHERE drops NULL and false alike) and no index can serve it: the
    # rows are found by primary key. Bare, it matched outbox_live_state, and the generic
    # plan read the state index, every live entry and every entry left by updates not yet
    # vacuumed, then filtered by id: over 33,000 finished rows whose entries autovacuum
    # had not reached, a one-row claim ran 2.2-2.7 ms; by primary key, 0.18-0.23 ms.
    #
    # The claim commits without waiting for its WAL flush (its set_config(
    # 'synchronous_commit', 'off', true) lasts to the end of the caller's transaction):
    # handlers start sooner, and the outcome's synchronous commit flushes the claim's
    # record first. A claim lost in a PostgreSQL crash only means the delivery runs again.
    # Jobs ended here (dead, expired) are followed by a synchronous NOTIFY commit, which
    # flushes them before their entries are acknowledged.
    JOB_CLAIM_ATTEMPTS: LiteralString = """
    SELECT id, state, attempts, max_attempts, timeout_seconds, keep_result, enq_ms, isolate
      FROM {schema}.claim_attempts(%(ids)s::int8[], %(entries)s::text[], %(worker)s::text, %(lease)s::float8)
    """

    # Which of these jobs are running (under someone's claim): a reclaimed entry of
    # such a job stays pending instead of being acknowledged.
    JOB_GET_RUNNING: LiteralString = """
    SELECT id FROM {schema}.outbox WHERE id = ANY(%(ids)s::int8[]) AND state = 'running'
    """

    # Record a batch of outcomes, fenced. ``state`` per row: succeeded, retrying,
    # dead, cancelled. Retries go back through the outbox (the relay republishes
    # when due). Terminal outcomes wake result waiters with one NOTIFY per batch (not
    # inside a handler's ctx.transaction(), ``notify`` false: PostgreSQL serializes the
    # commits of transactions that NOTIFY, which would undo group commit across jobs).
    # The outcome is stamped with clock_timestamp(), when it is written: now() is the
    # transaction's start. A snooze gives its attempt back (postbox.outcomes.snoozed).
    # The statement is the body of record_outcomes() (migration 0013), planned once per
    # connection as the claim is; its fence's state condition is wrapped in IS TRUE for
    # the same reason. Whom to notify is looked up only when an ended job belongs to a
    # workflow, jobs are passed on in ``also_notify``, or any waiter is registered (0020).
    JOB_RECORD_OUTCOMES: LiteralString = """
    SELECT id, notified
      FROM {schema}.record_outcomes(
           %(worker)s::text, %(ids)s::int8[], %(attempts)s::int4[], %(states)s::text[], %(outcomes)s::text[],
           %(delays)s::float8[], %(results)s::text[], %(result_ttls)s::float8[], %(error_classes)s::text[],
           %(errors)s::text[], %(tracebacks)s::text[], %(notify)s::bool, %(also_notify)s::text)
    """

    # ctx.transaction(): the job's success inside the handler's own transaction, sent
    # together with COMMIT (JOB_RECORD_SUCCESS_AND_COMMIT, worker/context.py). The
    # statements are in record_success() (migration 0006; 0007 stamps finished_at with
    # clock_timestamp(), the commit time, not now(), the transaction's start), where PostgreSQL keeps their
    # plans per connection: a simple query is planned every time it runs, and planning
    # the UPDATE with its history upsert cost more than running it. It writes what
    # JOB_RECORD_OUTCOMES writes for one 'succeeded' outcome without a result (notify
    # off), fenced the same way; keep the two in step (test_worker_delivery compares
    # their rows). A refused fence must abort the transaction, so the COMMIT behind it
    # does not run: the function raises STALE_ATTEMPT_SQLSTATE when no row was recorded.
    JOB_RECORD_SUCCESS: LiteralString = (
        "SELECT {schema}.record_success(%(id)s::int8, %(worker)s::text, %(attempt)s::int4)"
    )

    JOB_RECORD_SUCCESS_AND_COMMIT: LiteralString = JOB_RECORD_SUCCESS + ";\nCOMMIT"

    # The same call in SQLAlchemy's bind style, for a job's transaction on an ORM's
    # connection (jobs/sqlalchemy.py, through postbox.fence.JobFence; any driver).
    JOB_RECORD_SUCCESS_SQLALCHEMY: LiteralString = (
        "SELECT {schema}.record_success(CAST(:id AS int8), CAST(:worker AS text), CAST(:attempt AS int4))"
    )

    # A result set after the job's success already committed (keep_result with
    # ctx.transaction(): the return value is known only when the handler returns).
    JOB_SET_RESULT: LiteralString = """
    UPDATE {schema}.outbox SET result = %(result)s::jsonb, result_expires_at = now() + make_interval(secs => %(ttl)s)
     WHERE id = %(id)s AND state = 'succeeded'
    """

    # Lease renewal for the jobs a worker is running; returns the ids still ours.
    # Locked in id order first, as claims, outcomes and the relay's marks lock: the
    # same worker's outcome statement may be locking some of these rows right now.
    JOB_RENEW_LEASES: LiteralString = """
    WITH locked AS MATERIALIZED (
        SELECT ctid FROM {schema}.outbox
         WHERE id = ANY(%(ids)s::int8[]) AND claimed_by = %(worker)s AND state = 'running'
         ORDER BY id
           FOR UPDATE
    )
    UPDATE {schema}.outbox SET lease_until = now() + make_interval(secs => %(lease)s)
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM locked))
    RETURNING id
    """

    JOB_GET_CANCEL_REQUESTED: LiteralString = """
    SELECT id FROM {schema}.outbox
     WHERE id = ANY(%(ids)s::int8[]) AND cancel_requested_at IS NOT NULL AND state = 'running'
    """

    # Vanished entries whose job still runs under a live claim: looked at again
    # once that claim may have gone stale.
    JOB_GET_RUNNING_STREAM_IDS: LiteralString = """
    SELECT stream_id FROM {schema}.outbox
     WHERE queue = %(queue)s AND priority = %(priority)s AND stream_id = ANY(%(stream_ids)s::text[])
       AND state = 'running'
    """

    # --- outbox: claims released unrun (postbox.worker) -------------------------------------------
    # Three statements give rows back to the relay unrun (_release_claims): lost
    # entries, hand-backs, hold-backs. Each locks its rows in id order, clears the
    # claim and the publish mark (the relay publishes the row again when it is due),
    # and ends a stale claim's attempt as lost (it stays counted).

    # Stream entries XAUTOCLAIM reported deleted (lost in transport): make their
    # jobs publishable again. Queued rows go back to the relay's work list; running
    # rows under a stale claim too (their lost attempt stays counted).
    JOB_RELEASE_LOST_ENTRIES: LiteralString = (
        _release_claims(
            where="""queue = %(queue)s AND priority = %(priority)s AND stream_id = ANY(%(stream_ids)s::text[])
           AND (state = 'queued' OR (state = 'running' AND lease_until < now()))""",
        )
        + """
    SELECT id FROM released
    """
    )

    # Jobs this worker cannot run (it does not know their task, or its handler refuses
    # their args), handed back unclaimed for a worker that can: publishable again
    # after a delay, attempts untouched; ``reason`` is a format() text of the task. Only rows
    # whose publish is marked (queued): a hand-back before the relay's mark commits
    # would be overwritten by it. A running row under a stale claim (its worker died)
    # too; its lost attempt stays counted. Returns (id, handed back); false: not
    # marked yet, its entry stays pending for a later look.
    JOB_HAND_BACK: LiteralString = (
        _release_claims(
            where="""id = ANY(%(ids)s::int8[])
           AND ((state = 'queued' AND available_at <= now()) OR (state = 'running' AND lease_until < now()))""",
            also_set=""",
               available_at = now() + make_interval(secs => %(delay)s),
               last_error_class = %(error_class)s,
               last_error = format(%(reason)s, o.task)""",
        )
        + _RELEASED_OR_UNMARKED
    )

    # Jobs a limit holds back, unclaimed and with their attempts untouched: publishable
    # again at ``until`` (epoch seconds) — a rate reservation's time, or, for a job
    # waiting on a full concurrency key (``wait``), a recheck bound (a released slot
    # wakes it sooner: LIMIT_SLOT_RELEASE). As JOB_HAND_BACK: only rows whose publish is
    # marked, or running under a stale claim (its lost attempt stays counted).
    # Returns (id, held); false: not marked yet, its entry stays pending.
    JOB_HOLD_BACK: LiteralString = (
        _release_claims(
            also_select=""",
               array_position(%(ids)s::int8[], id) AS i""",
            where="""id = ANY(%(ids)s::int8[])
           AND ((state = 'queued' AND available_at <= now()) OR (state = 'running' AND lease_until < now())
                OR (id = ANY(%(direct)s::int8[]) AND state = 'pending' AND published_at IS NULL))""",
            also_set=""",
               -- A parked job's recheck backs off with each publish (x1, x2, x4 ... x16): a
               -- released slot wakes it at once; the recheck is only the safety net.
               available_at = CASE WHEN (%(waits)s::text[])[t.i] IS NULL
                                   THEN to_timestamp((%(until)s::float8[])[t.i])
                                   ELSE now() + make_interval(secs => %(recheck)s::float8
                                                              * power(2, least(greatest(o.publish_count - 1, 0), 4)))
                              END,
               flow_wait = (%(waits)s::text[])[t.i],
               flow_reserved_at = CASE WHEN (%(reserved)s::float8[])[t.i] IS NULL THEN o.flow_reserved_at
                                       ELSE to_timestamp((%(reserved)s::float8[])[t.i]) END""",
        )
        + _RELEASED_OR_UNMARKED
    )

    # --- outbox: flow control (worker/flow.py; docs/flow-control.md) ------------------------------
    # A claim of jobs under limits is one transaction: the keys' locks (LIMIT_LOCK_KEYS),
    # the jobs' rows (id order, as every claim locks them), the keys' state, the claim itself,
    # then the slots and rate cells taken and the jobs held back (JOB_HOLD_BACK).

    # These jobs' rows, locked (id order, as every claim locks them) in one snapshot:
    # ``marked`` rows may be claimed now under their limits — published and due
    # (queued), or running under a stale claim — with the rate token each holds from
    # an earlier hold-back; the others are due but their publish is not marked yet
    # (the relay adds the entry, then marks the row): a hold-back written before the
    # mark would be overwritten by it, so the worker looks at those again a moment
    # later. Rows not returned (finished, running under a live claim, expired) go
    # through JOB_CLAIM_ATTEMPTS, which ends or skips them.
    JOB_LOCK_FOR_LIMITS: LiteralString = """
    SELECT id, extract(epoch FROM flow_reserved_at)::float8,
           state IN ('queued', 'running') OR id = ANY(%(direct)s::int8[]) AS marked,
           state = 'running' AS stale_run
      FROM {schema}.outbox
     WHERE id = ANY(%(ids)s::int8[])
       AND ((state IN ('pending', 'queued', 'retrying') AND available_at <= now())
            OR (state = 'running' AND lease_until < now())
            -- taken straight from its parking by the worker that released a slot of its key
            OR (id = ANY(%(direct)s::int8[]) AND state = 'pending' AND published_at IS NULL
                AND flow_wait IS NOT NULL))
       AND NOT coalesce(expires_at <= now(), false)
     ORDER BY id
       FOR UPDATE
    """

    # Parked jobs taken straight from their parking and allowed to start: due now, so
    # that the claim (JOB_CLAIM_ATTEMPTS) takes them (rows locked in this transaction: the
    # relay never sees them due; they are running when it commits).
    JOB_MAKE_DUE: LiteralString = """
    UPDATE {schema}.outbox SET available_at = now() WHERE id = ANY(%(ids)s::int8[]) AND state = 'pending'
    """

    # A job whose rate reservation is near waits in the worker that read it (its
    # entry stays pending, so a dead worker's waits are reclaimed like any entry):
    # its token is written on its row, which stays published. Also the token of a
    # job read before the relay's mark, held back once it is marked. (Not a stale
    # run's row: that one is held back through the relay.)
    JOB_SET_RATE_TOKEN: LiteralString = """
    UPDATE {schema}.outbox o SET flow_reserved_at = to_timestamp(u.token)
      FROM unnest(%(ids)s::int8[], %(tokens)s::float8[]) AS u(id, token)
     WHERE o.id = u.id AND o.state IN ('queued', 'pending', 'retrying')
    RETURNING o.id
    """

    # Up to ``n`` jobs parked on each key, highest priority then oldest first: what the
    # releasing worker may take at once (as deliveries: its claim decides).
    JOB_GET_PARKED: LiteralString = """
    SELECT p.key, w.id, w.queue, w.task, w.args::text, w.headers::text, w.priority, w.enq_ms
      FROM unnest(%(keys)s::text[], %(counts)s::int4[]) AS p(key, n)
     CROSS JOIN LATERAL (
           SELECT o.id, o.queue, o.task, o.args, o.headers, o.priority,
                  (extract(epoch FROM o.created_at) * 1000)::int8 AS enq_ms
             FROM {schema}.outbox o
            WHERE o.flow_wait = p.key AND o.state = 'pending' AND o.published_at IS NULL
              AND o.available_at > now()
            ORDER BY o.priority DESC, o.id
            LIMIT p.n) w
    """

    # Wake up to ``n`` jobs parked on each key (due now; OUTBOX_NOTIFY wakes the
    # relay): for the released slots the releasing worker did not fill itself.
    JOB_WAKE_PARKED: LiteralString = """
    WITH picked AS (
        SELECT w.id
          FROM unnest(%(keys)s::text[], %(counts)s::int4[]) AS p(key, n)
         CROSS JOIN LATERAL (
               SELECT o.id FROM {schema}.outbox o
                WHERE o.flow_wait = p.key AND o.state = 'pending' AND o.published_at IS NULL
                  AND o.available_at > now()
                ORDER BY o.priority DESC, o.id
                LIMIT p.n
                  FOR UPDATE SKIP LOCKED) w
    ), woken AS (
        UPDATE {schema}.outbox o SET available_at = now() FROM picked WHERE o.id = picked.id RETURNING o.id
    )
    SELECT count(*) FROM woken
    """

    # --- outbox: reads and operator actions (the API, the admin CLI, postbox.results, postbox.testing) ---

    JOB_GET: LiteralString = """
    SELECT id, queue, task, priority, state, attempts, max_attempts, created_at, available_at, published_at,
           started_at, finished_at, expires_at, cancel_requested_at, discarded_at, dedup_key, keep_result,
           last_error_class, last_error, claimed_by, args, result, progress
      FROM {schema}.outbox WHERE id = %(id)s
    """

    JOB_GET_STATE: LiteralString = """
    SELECT id, queue, task, state, attempts FROM {schema}.outbox WHERE id = %(id)s
    """

    JOB_GET_RESULT: LiteralString = """
    SELECT state, result, last_error_class, last_error FROM {schema}.outbox WHERE id = %(id)s
    """

    # Newest first; the cursor is the last id of the previous page. NULL filters match everything.
    JOB_LIST: LiteralString = """
    SELECT id, queue, task, priority, state, attempts, max_attempts, created_at, available_at, published_at,
           started_at, finished_at, expires_at, cancel_requested_at, discarded_at, dedup_key, keep_result,
           last_error_class, last_error, claimed_by
      FROM {schema}.outbox
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(state)s::text IS NULL OR state = %(state)s)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
     ORDER BY id DESC
     LIMIT %(limit)s
    """

    JOB_LIST_DEAD: LiteralString = """
    SELECT id, queue, task, priority, state, attempts, max_attempts, created_at, available_at, published_at,
           started_at, finished_at, expires_at, cancel_requested_at, discarded_at, dedup_key, keep_result,
           last_error_class, last_error, claimed_by
      FROM {schema}.outbox
     WHERE state = 'dead'
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(discarded)s::boolean IS NULL OR (discarded_at IS NOT NULL) = %(discarded)s)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
     ORDER BY id DESC
     LIMIT %(limit)s
    """

    # Per-queue counts, exact at this statement's snapshot.
    JOB_COUNT_BY_QUEUE: LiteralString = """
    SELECT queue,
           count(*) FILTER (WHERE state IN ('pending', 'retrying') AND published_at IS NULL AND available_at <= now())
               AS backlog,
           count(*) FILTER (WHERE state = 'pending' AND available_at > now()) AS scheduled,
           count(*) FILTER (WHERE state = 'queued') AS queued,
           count(*) FILTER (WHERE state = 'running') AS in_flight,
           count(*) FILTER (WHERE state = 'retrying') AS retrying,
           count(*) FILTER (WHERE state = 'dead' AND discarded_at IS NULL) AS dead,
           count(*) FILTER (WHERE state = 'dead' AND discarded_at IS NOT NULL) AS discarded,
           extract(epoch FROM now() - min(available_at)
               FILTER (WHERE state IN ('pending', 'queued', 'retrying') AND available_at <= now()))::float8
               AS oldest_waiting_seconds
      FROM {schema}.outbox
     WHERE state IN ('pending', 'queued', 'running', 'retrying', 'dead')
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     GROUP BY queue
    """

    # Cancel: waiting jobs end at once; a running one gets a request the worker honours.
    JOB_CANCEL_WAITING: LiteralString = """
    UPDATE {schema}.outbox
       SET state = 'cancelled', finished_at = now(), cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE id = %(id)s AND state IN ('pending', 'queued', 'retrying', 'waiting')
    RETURNING id, queue, task, state, attempts
    """

    JOB_REQUEST_CANCEL: LiteralString = """
    UPDATE {schema}.outbox SET cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE id = %(id)s AND state = 'running'
    RETURNING id, queue, task, state, attempts
    """

    JOB_LOCK: LiteralString = """
    SELECT id, queue, task, state, attempts, discarded_at FROM {schema}.outbox WHERE id = %(id)s FOR UPDATE
    """

    JOB_REQUEUE_DEAD: LiteralString = """
    UPDATE {schema}.outbox
       SET state = 'pending', attempts = 0, available_at = now(), published_at = NULL, stream_id = NULL,
           claimed_by = NULL, lease_until = NULL, started_at = NULL, finished_at = NULL, discarded_at = NULL,
           cancel_requested_at = NULL, result = NULL, result_expires_at = NULL
     WHERE id = %(id)s AND state = 'dead'
    RETURNING id, queue, task, state, attempts
    """

    JOB_DISCARD_DEAD: LiteralString = """
    UPDATE {schema}.outbox SET discarded_at = coalesce(discarded_at, now())
     WHERE id = %(id)s AND state = 'dead'
    RETURNING id, queue, task, state, attempts, discarded_at
    """

    JOB_COUNT_PURGEABLE: LiteralString = """
    SELECT count(*) FROM {schema}.outbox
     WHERE queue = %(queue)s AND state = 'dead'
       AND (NOT %(discarded_only)s OR discarded_at IS NOT NULL)
       AND coalesce(discarded_at, finished_at, created_at) <= now() - make_interval(secs => %(older_than)s::float8)
    """

    # The purged jobs' attempts go in the same statement (job_attempts has no foreign
    # key to the outbox). Returns how many jobs were purged.
    JOB_PURGE_DEAD: LiteralString = """
    WITH gone AS (
        DELETE FROM {schema}.outbox
         WHERE queue = %(queue)s AND state = 'dead'
           AND (NOT %(discarded_only)s OR discarded_at IS NOT NULL)
           AND coalesce(discarded_at, finished_at, created_at) <= now() - make_interval(secs => %(older_than)s::float8)
        RETURNING id
    ), history AS (
        DELETE FROM {schema}.job_attempts a USING gone g WHERE a.outbox_id = g.id
    )
    SELECT count(*) FROM gone
    """

    # postbox.testing: the jobs the caller's own open transaction wrote, never another
    # transaction's committed ones. A visible row whose xmin (the transaction that
    # wrote it, or one of its subtransactions: savepoints, Django's atomic blocks) is
    # still in progress is this transaction's: another one's uncommitted rows are not
    # visible. pg_xact_status() wants a 64-bit id: the row's 32-bit xmin counted from
    # this transaction's own id (a subtransaction's id is never below it; a row from
    # below is not ours). created_at = now() (a job's created_at is its transaction's
    # start) comes first in the CASE, so rows of another age never reach the
    # conversion. No % operator: the statement runs on other drivers too.
    JOB_OF_TRANSACTION_FROM: LiteralString = """
      FROM {schema}.outbox o
     CROSS JOIN (SELECT pg_current_xact_id_if_assigned()::text::int8 AS top) me
     CROSS JOIN LATERAL (SELECT mod(o.xmin::text::int8 - mod(me.top, 4294967296) + 4294967296, 4294967296) AS ahead) x
     WHERE o.created_at = now()
       AND CASE WHEN me.top IS NULL OR o.created_at <> now() OR x.ahead >= 2147483648 THEN false
                ELSE pg_xact_status((me.top + x.ahead)::text::xid8) = 'in progress' END
    """

    JOB_LIST_OF_TRANSACTION: LiteralString = (
        "SELECT o.id, o.task, o.queue, o.priority, o.args, o.headers, o.state, o.attempts, o.dedup_key"
        + JOB_OF_TRANSACTION_FROM
        + " ORDER BY o.id"
    )

    # What an inline run may claim now (JOB_CLAIM_ATTEMPTS decides, as for a worker).
    JOB_GET_DUE_OF_TRANSACTION: LiteralString = (
        "SELECT o.id, o.task, o.queue"
        + JOB_OF_TRANSACTION_FROM
        + " AND o.state IN ('pending', 'queued', 'retrying') AND o.available_at <= now() ORDER BY o.id"
    )

    JOB_GET_PAYLOAD: LiteralString = """
    SELECT task, queue, args, headers FROM {schema}.outbox WHERE id = %(id)s
    """

    # An inline run's retry is due at once: JOB_RECORD_OUTCOMES counts its due time
    # from clock_timestamp(), later than the test transaction's now() that the
    # claim compares with, so it is moved back to now().
    JOB_RETRY_DUE_NOW: LiteralString = """
    UPDATE {schema}.outbox SET available_at = now() WHERE id = %(id)s AND state = 'retrying' AND available_at > now()
    """

    # --- job_attempts: the history of ended attempts ----------------------------------------------

    # An isolated run (a takeover, run alone) writes its attempt's row when it starts:
    # if its worker dies now, the crash is charged to it (JOB_CLAIM_ATTEMPTS).
    JOB_ATTEMPT_START_ISOLATED: LiteralString = """
    INSERT INTO {schema}.job_attempts (outbox_id, attempt, worker_id, started_at)
    SELECT id, attempts, claimed_by, now() FROM {schema}.outbox
     WHERE id = %(id)s AND attempts = %(attempt)s AND claimed_by = %(worker)s AND state = 'running'
    ON CONFLICT (outbox_id, attempt) DO NOTHING
    """

    # Ended attempts from job_attempts, and the attempt running now from the outbox
    # row (its history row is written when it ends).
    JOB_ATTEMPT_LIST: LiteralString = """
    SELECT attempt, worker_id, started_at, finished_at, outcome, error_class, error, traceback
      FROM {schema}.job_attempts WHERE outbox_id = %(id)s
    UNION ALL
    SELECT o.attempts, o.claimed_by, o.started_at, NULL, NULL, NULL, NULL, NULL
      FROM {schema}.outbox o
     WHERE o.id = %(id)s AND o.state = 'running'
       AND NOT EXISTS (SELECT 1 FROM {schema}.job_attempts a WHERE a.outbox_id = o.id AND a.attempt = o.attempts)
     ORDER BY started_at, attempt
    """

    # Requeue a dead letter through the outbox. The attempts of its earlier life are
    # kept in job_attempts, moved below zero (attempt - 1,000,000 x round) so the new
    # life's attempts 1, 2, ... do not collide with them; readers map them back.
    JOB_ATTEMPT_ARCHIVE: LiteralString = """
    UPDATE {schema}.job_attempts
       SET attempt = attempt - 1000000 * (1 + (
               SELECT (coalesce(-min(attempt), 0) + 999999) / 1000000
                 FROM {schema}.job_attempts WHERE outbox_id = %(id)s AND attempt <= 0))
     WHERE outbox_id = %(id)s AND attempt > 0
    """

    # --- result_waiters: who waits for a job's result (postbox.results; migration 0014) ------------

    # A waiter registers before it reads the job (record_outcomes() and notify_results() NOTIFY
    # only the jobs of a workflow or with a waiter); a registration also clears the ones a
    # minute past their deadline that nobody removed (a waiter that died).
    RESULT_WAITER_ADD: LiteralString = """
    WITH stale AS (DELETE FROM {schema}.result_waiters WHERE until < now() - interval '1 minute')
    INSERT INTO {schema}.result_waiters (job_id, until)
    VALUES (%(job)s, now() + make_interval(secs => %(seconds)s))
    RETURNING id
    """

    RESULT_WAITER_REMOVE: LiteralString = "DELETE FROM {schema}.result_waiters WHERE id = %(id)s"

    # --- processed_jobs: the idempotency keys of ctx.transaction() --------------------------------

    # ctx.transaction(): the job id as the idempotency key of its effects (postbox.testing
    # runs this one; the worker the same INSERT through begin_processed(), migration 0006).
    PROCESSED_INSERT: LiteralString = """
    INSERT INTO {schema}.processed_jobs (outbox_id) VALUES (%(id)s)
    ON CONFLICT (outbox_id) DO NOTHING RETURNING outbox_id
    """

    # The processed row as the worker inserts it: the job's id when fresh, NULL when an
    # earlier run committed it.
    PROCESSED_BEGIN: LiteralString = "SELECT {schema}.begin_processed(%(id)s::int8)"

    # The same in SQLAlchemy's bind style (jobs/sqlalchemy.py, through postbox.fence.JobFence).
    PROCESSED_BEGIN_SQLALCHEMY: LiteralString = "SELECT {schema}.begin_processed(CAST(:id AS int8))"

    # The two round trips of ctx.transaction() around the handler's body, each one
    # simple query of two statements (worker/context.py binds the parameters on the
    # client side): BEGIN with the processed row, the success with COMMIT.
    PROCESSED_BEGIN_TRANSACTION: LiteralString = "BEGIN;" + PROCESSED_BEGIN

    # --- retention (postbox.retention): outbox, processed_jobs, limit state -----------------------
    # Pruning in small batches, one short transaction each; SKIP LOCKED so a row someone
    # holds is left for the next round. %(now)s is NULL in production (the database clock)
    # and a fixed time in tests.

    # Finished jobs (never dead letters: those wait for an operator's discard + purge).
    # Their job_attempts go in the same statement (job_attempts has no foreign key);
    # results live in the outbox row.
    JOB_DELETE_FINISHED: LiteralString = """
    WITH doomed AS (
        SELECT id, workflow_id FROM {schema}.outbox
         WHERE finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(age)s::float8)
           AND state IN ('succeeded', 'cancelled', 'expired')
         ORDER BY finished_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM {schema}.outbox o USING doomed d WHERE o.id = d.id
        RETURNING o.id
    ), history AS (
        DELETE FROM {schema}.job_attempts a USING gone g WHERE a.outbox_id = g.id
    ), workflow_edges_gone AS (
        -- a workflow's job deleted: the edges into it and its join counters go with it (it has ended)
        DELETE FROM {schema}.workflow_edges e USING gone g WHERE e.child_id = g.id
    ), workflow_joins_gone AS (
        DELETE FROM {schema}.workflow_joins j USING gone g WHERE j.job_id = g.id
    ), workflows_gone AS (
        -- and the workflow once no job of it is left
        DELETE FROM {schema}.workflows w
         WHERE w.id IN (SELECT workflow_id FROM doomed WHERE workflow_id IS NOT NULL)
           AND NOT EXISTS (SELECT 1 FROM {schema}.outbox o
                            WHERE o.workflow_id = w.id AND o.id NOT IN (SELECT id FROM doomed))
    )
    SELECT id FROM gone
    """

    JOB_COUNT_FINISHED: LiteralString = """
    SELECT count(*) FROM {schema}.outbox
     WHERE finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(age)s::float8)
       AND state IN ('succeeded', 'cancelled', 'expired')
    """

    # Results past their own expiry (result_expires_at, set from the task's result
    # TTL) are cleared on rows that are kept.
    JOB_CLEAR_EXPIRED_RESULTS: LiteralString = """
    WITH doomed AS (
        SELECT id FROM {schema}.outbox
         WHERE result_expires_at <= coalesce(%(now)s::timestamptz, now())
         ORDER BY result_expires_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.outbox o SET result = NULL, result_expires_at = NULL FROM doomed d WHERE o.id = d.id
    RETURNING o.id
    """

    JOB_COUNT_EXPIRED_RESULTS: LiteralString = """
    SELECT count(*) FROM {schema}.outbox WHERE result_expires_at <= coalesce(%(now)s::timestamptz, now())
    """

    # Idempotency markers, only once their job is finished for good (or gone): a
    # marker of a job that may still run (or be requeued from the DLQ) is kept.
    PROCESSED_DELETE_OLD: LiteralString = """
    WITH doomed AS (
        SELECT p.outbox_id FROM {schema}.processed_jobs p
         WHERE p.processed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(age)s::float8)
           AND NOT EXISTS (SELECT 1 FROM {schema}.outbox o
                            WHERE o.id = p.outbox_id AND o.state NOT IN ('succeeded', 'cancelled', 'expired'))
         ORDER BY p.processed_at
         LIMIT %(limit)s
           FOR UPDATE OF p SKIP LOCKED
    )
    DELETE FROM {schema}.processed_jobs p USING doomed d WHERE p.outbox_id = d.outbox_id
    RETURNING p.outbox_id
    """

    PROCESSED_COUNT_OLD: LiteralString = """
    SELECT count(*) FROM {schema}.processed_jobs p
     WHERE p.processed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(age)s::float8)
       AND NOT EXISTS (SELECT 1 FROM {schema}.outbox o
                        WHERE o.id = p.outbox_id AND o.state NOT IN ('succeeded', 'cancelled', 'expired'))
    """

    # Flow-control state that no longer counts: slots whose job does not run under a
    # live claim with that attempt, and rate cells in the past (an absent cell means
    # the same: the next start conforms now). Claims lock a key before reading its
    # state; a cell or slot deleted here is one they would ignore.
    LIMIT_DELETE_DEAD_STATE: LiteralString = """
    WITH dead_slots AS (
        SELECT s.key, s.job_id FROM {schema}.limit_slots s
         WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox o
                            WHERE o.id = s.job_id AND o.attempts = s.attempt AND o.state = 'running'
                              AND o.lease_until > coalesce(%(now)s::timestamptz, now()))
         LIMIT %(limit)s
           FOR UPDATE OF s SKIP LOCKED
    ), slots AS (
        DELETE FROM {schema}.limit_slots s USING dead_slots d WHERE s.key = d.key AND s.job_id = d.job_id
        RETURNING 1
    ), cells AS (
        DELETE FROM {schema}.limit_rates r
         WHERE r.key IN (SELECT key FROM {schema}.limit_rates
                          WHERE greatest(tat, start_tat) < coalesce(%(now)s::timestamptz, now()) - interval '1 minute'
                          LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT 1 FROM slots UNION ALL SELECT 1 FROM cells
    """

    LIMIT_COUNT_DEAD_STATE: LiteralString = """
    SELECT (SELECT count(*) FROM {schema}.limit_slots s
             WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox o
                                WHERE o.id = s.job_id AND o.attempts = s.attempt AND o.state = 'running'
                                  AND o.lease_until > coalesce(%(now)s::timestamptz, now())))
         + (SELECT count(*) FROM {schema}.limit_rates
             WHERE greatest(tat, start_tat) < coalesce(%(now)s::timestamptz, now()) - interval '1 minute')
    """

    # --- tasks: the task definitions --------------------------------------------------------------

    # The task definitions a worker or the API loaded: what postbox.enqueue() applies
    # to a job enqueued from SQL without its options (jobs/definitions.py).
    TASK_UPSERT_MANY: LiteralString = """
    INSERT INTO {schema}.tasks AS t (name, queue, priority, max_attempts, timeout_seconds, keep_result, retry,
                                     unique_rule, updated_at, updated_by)
    SELECT n, q, p, m, tmo, kr, r::jsonb, ur::jsonb, now(), %(by)s
      FROM unnest(%(name)s::text[], %(queue)s::text[], %(priority)s::int2[], %(max_attempts)s::int4[],
                  %(timeout)s::float8[], %(keep_result)s::bool[], %(retry)s::text[], %(unique_rule)s::text[])
           AS u(n, q, p, m, tmo, kr, r, ur)
    ON CONFLICT (name) DO UPDATE
       SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
           timeout_seconds = excluded.timeout_seconds, keep_result = excluded.keep_result, retry = excluded.retry,
           unique_rule = excluded.unique_rule, updated_at = now(), updated_by = excluded.updated_by
     WHERE (t.queue, t.priority, t.max_attempts, t.timeout_seconds, t.keep_result, t.retry, t.unique_rule)
           IS DISTINCT FROM (excluded.queue, excluded.priority, excluded.max_attempts, excluded.timeout_seconds,
                             excluded.keep_result, excluded.retry, excluded.unique_rule)
    """

    # The queues of the published task definitions: queues that exist before their first job.
    TASK_LIST_QUEUES: LiteralString = """
    SELECT DISTINCT queue FROM {schema}.tasks ORDER BY queue
    """

    # --- relays and leadership (postbox.relay.leader) ---------------------------------------------

    LEADER_TRY_LOCK: LiteralString = "SELECT pg_try_advisory_lock(%(key)s)"

    LEADER_UNLOCK: LiteralString = "SELECT pg_advisory_unlock(%(key)s)"

    # A new leader takes the next term: one more than any term ever recorded. Holding
    # the lock proves that no other relay leads: a row still saying so (a killed
    # leader's) is set to stopped; a live one records its own role again on its
    # next session. A row someone holds is left as it is (the heartbeat's bookkeeping
    # records it stopped later): the election never waits on another session.
    LEADER_ELECT: LiteralString = """
    WITH deposed AS (
        UPDATE {schema}.relays SET role = 'stopped'
         WHERE id IN (SELECT id FROM {schema}.relays WHERE role = 'leader' AND id <> %(id)s FOR UPDATE SKIP LOCKED)
    )
    UPDATE {schema}.relays SET role = 'leader', last_seen = now(),
           term = (SELECT coalesce(max(term), 0) + 1 FROM {schema}.relays)
     WHERE id = %(id)s
    RETURNING term
    """

    # Who holds the leader lock (what a standby waits on): the backend holding the advisory
    # lock, and the relay registered as leader (a row, even a stale one, may name it).
    LEADER_GET_HOLDER: LiteralString = """
    SELECT l.pid, a.application_name, host(a.client_addr),
           r.id, r.host, r.pid, r.term, extract(epoch FROM now() - r.last_seen)::float8
      FROM pg_locks l
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
      LEFT JOIN LATERAL (SELECT id, host, pid, term, last_seen FROM {schema}.relays
                          WHERE role = 'leader' AND id <> %(id)s ORDER BY term DESC LIMIT 1) r ON true
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
       AND l.classid = ((%(key)s::bigint >> 32) & 4294967295)::oid AND l.objid = (%(key)s::bigint & 4294967295)::oid
     LIMIT 1
    """

    RELAY_UPSERT: LiteralString = """
    INSERT INTO {schema}.relays (id, host, pid, role, term) VALUES (%(id)s, %(host)s, %(pid)s, %(role)s, 0)
    ON CONFLICT (id) DO UPDATE SET role = excluded.role, last_seen = now()
    """

    RELAY_SET_ROLE: LiteralString = """
    UPDATE {schema}.relays SET role = %(role)s, last_seen = now() WHERE id = %(id)s
    """

    # Every relay's heartbeat records its own role, and keeps the registries true:
    # a relay silent for longer than its lock session may live, or a worker silent
    # for longer than its lease, is recorded stopped (killed, or frozen: a frozen
    # worker's next heartbeat clears its stopped_at again). Rows someone holds are
    # skipped until a later heartbeat: the leader's session never waits on them (a
    # wait would keep it busy, and its lock held, while it publishes nothing).
    RELAY_HEARTBEAT: LiteralString = """
    WITH gone_relays AS (
        UPDATE {schema}.relays SET role = 'stopped'
         WHERE id IN (SELECT id FROM {schema}.relays
                       WHERE id <> %(id)s AND role <> 'stopped'
                         AND last_seen < now() - make_interval(secs => %(relay_stale)s)
                         FOR UPDATE SKIP LOCKED)
    ), gone_workers AS (
        UPDATE {schema}.workers SET stopped_at = last_seen, in_flight = 0
         WHERE id IN (SELECT id FROM {schema}.workers
                       WHERE stopped_at IS NULL AND last_seen < now() - make_interval(secs => %(worker_stale)s)
                         FOR UPDATE SKIP LOCKED)
    )
    UPDATE {schema}.relays SET last_seen = now(), role = %(role)s WHERE id = %(id)s
    """

    # --- workers: the worker registry -------------------------------------------------------------

    WORKER_UPSERT: LiteralString = """
    INSERT INTO {schema}.workers (id, host, pid, queues, concurrency, in_flight, processed, failed)
    VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(in_flight)s, %(processed)s, %(failed)s)
    ON CONFLICT (id) DO UPDATE
       SET last_seen = now(), in_flight = excluded.in_flight, processed = excluded.processed,
           failed = excluded.failed, queues = excluded.queues, stopped_at = NULL
    """

    WORKER_SET_STOPPED: LiteralString = """
    UPDATE {schema}.workers SET stopped_at = now(), last_seen = now(), in_flight = 0, processed = %(processed)s,
           failed = %(failed)s
     WHERE id = %(id)s
    """

    WORKER_LIST: LiteralString = """
    SELECT id, host, pid, queues, concurrency, started_at, last_seen, in_flight, processed, failed, stopped_at,
           last_seen < now() - make_interval(secs => 3 * %(heartbeat)s::float8) AS stale,
           extract(epoch FROM now() - last_seen)::float8 AS age_seconds
      FROM {schema}.workers
     WHERE (%(id)s::text IS NULL OR id = %(id)s)
     ORDER BY started_at DESC, id
    """

    # --- queues: pause, and the depth lock --------------------------------------------------------

    QUEUE_GET_PAUSED: LiteralString = """
    SELECT name FROM {schema}.queues WHERE paused AND name = ANY(%(queues)s::text[])
    """

    QUEUE_LIST: LiteralString = """
    SELECT name, paused, updated_at FROM {schema}.queues WHERE (%(queue)s::text IS NULL OR name = %(queue)s)
    """

    QUEUE_EXISTS: LiteralString = """
    SELECT EXISTS (SELECT 1 FROM {schema}.outbox WHERE queue = %(queue)s)
        OR EXISTS (SELECT 1 FROM {schema}.queues WHERE name = %(queue)s)
    """

    QUEUE_SET_PAUSED: LiteralString = """
    INSERT INTO {schema}.queues (name, paused, updated_at) VALUES (%(queue)s, %(paused)s, now())
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
    RETURNING name, paused, updated_at
    """

    # Serialises the API's depth-checked enqueues of one queue until COMMIT, so that
    # POSTBOX_MAX_QUEUE_DEPTH is exact: the count and the insert happen under the lock.
    # Two-key form (class, hash of the queue): apart from the relay's one-key lock.
    QUEUE_LOCK_DEPTH: LiteralString = """
    SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(queue)s))
    """

    # --- limits, limit_slots, limit_rates (worker/flow.py; the operator services) -----------------

    LIMIT_LOCK_KEYS: LiteralString = """
    SELECT count(pg_advisory_xact_lock(1718382455, hashtext(k))) FROM unnest(%(keys)s::text[]) AS k
    """

    # The database clock, the live slots of the concurrency keys (a slot counts while
    # its job runs under a live claim: a lease, never a counter that leaks) and the
    # rate cells. Dead slots of these keys are deleted on the way.
    # ('dead', key, n): slots of that key freed by a lease's expiry, whose parked jobs the
    # claim wakes (no release will: their worker died or froze).
    LIMIT_GET_STATE: LiteralString = """
    WITH dead AS (
        DELETE FROM {schema}.limit_slots s
         WHERE s.key = ANY(%(conc_keys)s::text[])
           AND NOT EXISTS (SELECT 1 FROM {schema}.outbox o
                            WHERE o.id = s.job_id AND o.attempts = s.attempt AND o.state = 'running'
                              AND o.lease_until > clock_timestamp())
        RETURNING s.key
    ), live AS (
        SELECT s.key, count(*) AS n
          FROM {schema}.limit_slots s JOIN {schema}.outbox o ON o.id = s.job_id
         WHERE s.key = ANY(%(conc_keys)s::text[]) AND o.attempts = s.attempt AND o.state = 'running'
           AND o.lease_until > clock_timestamp()
         GROUP BY s.key
    )
    SELECT 'now', '', extract(epoch FROM clock_timestamp())::float8
    UNION ALL
    SELECT 'used', key, n::float8 FROM live
    UNION ALL
    SELECT 'tat', key, extract(epoch FROM tat)::float8 FROM {schema}.limit_rates WHERE key = ANY(%(rate_keys)s::text[])
    UNION ALL
    SELECT 'stat', key, extract(epoch FROM start_tat)::float8
      FROM {schema}.limit_rates WHERE key = ANY(%(rate_keys)s::text[])
    UNION ALL
    SELECT 'dead', key, count(*)::float8 FROM dead GROUP BY key
    """

    # Slots taken by the jobs just claimed, rate cells moved, and the claimed jobs'
    # hold-back marks cleared.
    LIMIT_TAKE: LiteralString = """
    WITH slots AS (
        INSERT INTO {schema}.limit_slots (key, job_id, attempt)
        SELECT k, j, a FROM unnest(%(slot_keys)s::text[], %(slot_ids)s::int8[], %(slot_attempts)s::int4[]) AS u(k, j, a)
        ON CONFLICT (key, job_id) DO UPDATE SET attempt = excluded.attempt, taken_at = now()
    ), cells AS (
        INSERT INTO {schema}.limit_rates (key, tat, start_tat)
        SELECT k, to_timestamp(t), to_timestamp(st)
          FROM unnest(%(rate_keys)s::text[], %(tats)s::float8[], %(stats)s::float8[]) AS u(k, t, st)
        ON CONFLICT (key) DO UPDATE SET tat = excluded.tat, start_tat = excluded.start_tat
    ), cleared AS (
        UPDATE {schema}.outbox SET flow_wait = NULL, flow_reserved_at = NULL
         WHERE id = ANY(%(claimed)s::int8[]) AND (flow_wait IS NOT NULL OR flow_reserved_at IS NOT NULL)
    )
    SELECT 1
    """

    # After outcomes are recorded: their slots are released (fenced by attempt: a slot
    # a newer attempt took stays). Returns each key and how many of its slots were freed.
    LIMIT_SLOT_RELEASE: LiteralString = """
    WITH freed AS (
        DELETE FROM {schema}.limit_slots s
         USING unnest(%(ids)s::int8[], %(attempts)s::int4[]) AS u(id, attempt)
         WHERE s.job_id = u.id AND s.attempt = u.attempt
        RETURNING s.key
    )
    SELECT key, count(*)::int FROM freed GROUP BY key
    """

    # What workers declare in code (published when they start); a row changes only
    # when the declaration did. A scope/name without limits is written only if a row
    # exists (its declaration removed).
    LIMIT_UPSERT_DECLARED: LiteralString = """
    INSERT INTO {schema}.limits AS l (scope, name, declared, declared_by, declared_at)
    SELECT u.s, u.n, u.d::jsonb, %(by)s, now()
      FROM unnest(%(scopes)s::text[], %(names)s::text[], %(declared)s::text[]) AS u(s, n, d)
     WHERE u.d IS NOT NULL OR EXISTS (SELECT 1 FROM {schema}.limits x WHERE x.scope = u.s AND x.name = u.n)
    ON CONFLICT (scope, name) DO UPDATE
       SET declared = excluded.declared, declared_by = excluded.declared_by, declared_at = now()
     WHERE l.declared IS DISTINCT FROM excluded.declared
    """

    # The limits in force for a worker's queues and tasks (declared + override).
    LIMIT_GET_IN_FORCE: LiteralString = """
    SELECT scope, name, declared, override FROM {schema}.limits
     WHERE (scope = 'queue' AND name = ANY(%(queues)s::text[])) OR (scope = 'task' AND name = ANY(%(tasks)s::text[]))
    """

    # The limits in force for the queues and tasks of a limited claim, read in its
    # transaction (not the worker's cached copy) and share-locked: an override
    # (LIMIT_LOCK) waits for the claims deciding under the old value, and every claim
    # after its commit decides under the new one.
    LIMIT_GET_IN_FORCE_LOCKED: LiteralString = """
    SELECT scope, name, declared, override FROM {schema}.limits
     WHERE (scope = 'queue' AND name = ANY(%(queues)s::text[])) OR (scope = 'task' AND name = ANY(%(tasks)s::text[]))
     ORDER BY scope, name
       FOR SHARE
    """

    # A limit raised or lifted: wake the jobs parked on its key (a task's partitions
    # too) up to the room the new limit leaves — the limit, less the live slots, less
    # the jobs already woken and not yet claimed (so workers that all see the change
    # wake no more than the room between them). ``limit`` NULL: lifted, wake them all.
    JOB_WAKE_PARKED_TO_LIMIT: LiteralString = """
    WITH keys AS (
        SELECT DISTINCT o.flow_wait AS key FROM {schema}.outbox o
         WHERE (o.flow_wait = %(key)s OR starts_with(o.flow_wait, %(key)s || '|'))
           AND o.state = 'pending' AND o.published_at IS NULL AND o.available_at > now()
    ), room AS (
        SELECT k.key,
               CASE WHEN %(limit)s::int4 IS NULL THEN NULL ELSE greatest(0, %(limit)s::int4
                 - (SELECT count(*) FROM {schema}.limit_slots s JOIN {schema}.outbox o ON o.id = s.job_id
                     WHERE s.key = k.key AND o.attempts = s.attempt AND o.state = 'running'
                       AND o.lease_until > clock_timestamp())
                 - (SELECT count(*) FROM {schema}.outbox o
                     WHERE o.flow_wait = k.key AND o.state IN ('pending', 'queued') AND o.available_at <= now()))
               END AS n
          FROM keys k
    ), picked AS (
        SELECT w.id
          FROM room r
         CROSS JOIN LATERAL (
               SELECT o.id FROM {schema}.outbox o
                WHERE o.flow_wait = r.key AND o.state = 'pending' AND o.published_at IS NULL
                  AND o.available_at > now()
                ORDER BY o.priority DESC, o.id
                LIMIT r.n
                  FOR UPDATE SKIP LOCKED) w
    ), woken AS (
        UPDATE {schema}.outbox o SET available_at = now() FROM picked WHERE o.id = picked.id RETURNING o.id
    )
    SELECT count(*) FROM woken
    """

    # --- flow control: operations (app/services/limits.py; the API, the CLI, metrics) -----
    # Every limit row with its task's queue, the slots in use under its keys (a slot
    # counts as LIMIT_GET_STATE counts it: its job running under a live lease; a task's
    # partitions summed) and the jobs of that queue or task held back (waiting for a
    # slot, or for a rate reservation still ahead). One row when scope is given.
    LIMIT_LIST: LiteralString = """
    WITH l AS (
        SELECT l.scope, l.name, l.declared, l.declared_by, l.declared_at, l.override, l.override_by, l.override_at,
               CASE WHEN l.scope = 'queue' THEN l.name::text ELSE t.queue::text END AS queue
          FROM {schema}.limits l
          LEFT JOIN {schema}.tasks t ON l.scope = 'task' AND t.name = l.name
         WHERE %(scope)s::text IS NULL OR (l.scope = %(scope)s AND l.name = %(name)s)
    ), live AS MATERIALIZED (
        SELECT s.key, count(*) AS n
          FROM {schema}.limit_slots s JOIN {schema}.outbox o ON o.id = s.job_id
         WHERE o.attempts = s.attempt AND o.state = 'running' AND o.lease_until > clock_timestamp()
         GROUP BY s.key
    ), held AS MATERIALIZED (
        -- Two index scans, not one over every pending job: parked jobs (outbox_flow_wait),
        -- and rate reservations, whose held job is due at its reservation (JOB_HOLD_BACK),
        -- among the unpublished jobs due later (outbox_unpublished_due).
        SELECT queue, task, count(*) AS n,
               count(*) FILTER (WHERE flow_wait IS NOT NULL) AS for_slot,
               count(*) FILTER (WHERE flow_reserved_at > now()) AS for_rate
          FROM (SELECT queue, task, flow_wait, flow_reserved_at FROM {schema}.outbox
                 WHERE flow_wait IS NOT NULL AND state = 'pending'
                UNION ALL
                SELECT queue, task, flow_wait, flow_reserved_at FROM {schema}.outbox
                 WHERE flow_wait IS NULL AND flow_reserved_at > now() AND state = 'pending'
                   AND published_at IS NULL AND available_at > now()) h
         GROUP BY queue, task
    )
    SELECT l.scope, l.name, l.queue, l.declared, l.declared_by, l.declared_at, l.override, l.override_by,
           l.override_at, coalesce(u.in_use, 0)::int8 AS in_use, coalesce(u.partitions, 0)::int8 AS partitions_in_use,
           coalesce(h.n, 0)::int8 AS held, coalesce(h.for_slot, 0)::int8 AS held_for_slot,
           coalesce(h.for_rate, 0)::int8 AS held_for_rate
      FROM l
      LEFT JOIN LATERAL (
          SELECT sum(live.n) AS in_use, count(*) FILTER (WHERE live.key <> l.scope || ':' || l.name) AS partitions
            FROM live
           WHERE live.key = l.scope || ':' || l.name
              OR (l.scope = 'task' AND starts_with(live.key, 'task:' || l.name || '|'))
      ) u ON true
      LEFT JOIN LATERAL (
          SELECT sum(held.n) AS n, sum(held.for_slot) AS for_slot, sum(held.for_rate) AS for_rate
            FROM held
           WHERE (l.scope = 'queue' AND held.queue = l.name) OR (l.scope = 'task' AND held.task = l.name)
      ) h ON true
     ORDER BY l.scope, l.name
    """

    # The row an override changes, locked (none: not created yet).
    LIMIT_LOCK: LiteralString = """
    SELECT override FROM {schema}.limits WHERE scope = %(scope)s AND name = %(name)s FOR UPDATE
    """

    # An override's fields merged into the row's (created if none; workers reload it within a second).
    LIMIT_SET_OVERRIDE: LiteralString = """
    INSERT INTO {schema}.limits AS l (scope, name, override, override_by, override_at)
    VALUES (%(scope)s, %(name)s, %(override)s::jsonb, %(by)s, now())
    ON CONFLICT (scope, name) DO UPDATE
       SET override = coalesce(l.override, '{{}}'::jsonb) || excluded.override,
           override_by = excluded.override_by, override_at = now()
    RETURNING override
    """

    # The whole override (field NULL) or one of its fields lifted; an empty override is none.
    LIMIT_CLEAR_OVERRIDE: LiteralString = """
    UPDATE {schema}.limits
       SET override = CASE WHEN %(field)s::text IS NULL THEN NULL
                           ELSE nullif(override - %(field)s::text, '{{}}'::jsonb) END,
           override_by = %(by)s, override_at = now()
     WHERE scope = %(scope)s AND name = %(name)s
    RETURNING override
    """

    # --- schedules, schedule_runs: periodic jobs --------------------------------------------------
    # (The leader ticks on its lock session, everything else on its own connection.)

    # Upsert the declared schedules. A changed timing (cron, interval or zone) or a
    # schedule declared again after its removal starts from the sync's now (EXCLUDED's
    # cursor_at/next_run_at): no catch-up of the old expression, no occurrence twice.
    SCHEDULE_UPSERT_DECLARED: LiteralString = """
    INSERT INTO {schema}.schedules AS s (name, task, queue, priority, max_attempts, args, cron, every_seconds, tz,
                                         catch_up, max_catch_up, grace_seconds, cursor_at, next_run_at)
    SELECT n, t, q, p, m, a::jsonb, c, e, z, cu, mc, g, %(now)s::timestamptz, nr
      FROM unnest(%(name)s::text[], %(task)s::text[], %(queue)s::text[], %(priority)s::int2[],
                  %(max_attempts)s::int[], %(args)s::text[], %(cron)s::text[], %(every)s::float8[], %(tz)s::text[],
                  %(catch_up)s::text[], %(max_catch_up)s::int[], %(grace)s::float8[], %(next_run)s::timestamptz[])
           AS u(n, t, q, p, m, a, c, e, z, cu, mc, g, nr)
    ON CONFLICT (name) DO UPDATE
       SET task = EXCLUDED.task, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
           max_attempts = EXCLUDED.max_attempts, args = EXCLUDED.args, catch_up = EXCLUDED.catch_up,
           max_catch_up = EXCLUDED.max_catch_up, grace_seconds = EXCLUDED.grace_seconds,
           cron = EXCLUDED.cron, every_seconds = EXCLUDED.every_seconds, tz = EXCLUDED.tz,
           cursor_at = CASE WHEN s.removed_at IS NOT NULL
                              OR (s.cron, s.every_seconds, s.tz) IS DISTINCT FROM
                                 (EXCLUDED.cron, EXCLUDED.every_seconds, EXCLUDED.tz)
                            THEN greatest(s.cursor_at, EXCLUDED.cursor_at) ELSE s.cursor_at END,
           next_run_at = CASE WHEN s.removed_at IS NOT NULL
                                OR (s.cron, s.every_seconds, s.tz) IS DISTINCT FROM
                                   (EXCLUDED.cron, EXCLUDED.every_seconds, EXCLUDED.tz)
                              THEN EXCLUDED.next_run_at ELSE s.next_run_at END,
           removed_at = NULL, updated_at = now()
     WHERE s.removed_at IS NOT NULL
        OR (s.task, s.queue, s.priority, s.max_attempts, s.args, s.cron, s.every_seconds, s.tz, s.catch_up,
            s.max_catch_up, s.grace_seconds)
           IS DISTINCT FROM
           (EXCLUDED.task, EXCLUDED.queue, EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.args, EXCLUDED.cron,
            EXCLUDED.every_seconds, EXCLUDED.tz, EXCLUDED.catch_up, EXCLUDED.max_catch_up, EXCLUDED.grace_seconds)
    RETURNING name, (xmax = 0) AS inserted
    """

    # Schedules of the tasks this process owns that its code no longer declares.
    SCHEDULE_MARK_REMOVED: LiteralString = """
    UPDATE {schema}.schedules SET removed_at = now(), updated_at = now()
     WHERE removed_at IS NULL AND task = ANY(%(tasks)s::text[]) AND NOT (name = ANY(%(names)s::text[]))
    RETURNING name
    """

    SCHEDULE_LOCK_DUE: LiteralString = """
    SELECT name, task, queue, priority, max_attempts, args::text AS args, cron, every_seconds, tz, catch_up,
           max_catch_up, grace_seconds, cursor_at, next_run_at
      FROM {schema}.schedules
     WHERE next_run_at <= %(now)s::timestamptz AND NOT paused AND removed_at IS NULL
     ORDER BY next_run_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
    """

    # Record the occurrences and enqueue their jobs in one statement: a job is inserted
    # only for an occurrence whose (schedule, occurrence) row is new.
    SCHEDULE_RUN_INSERT: LiteralString = """
    WITH occ AS (
        SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
               AS u(id bigint, name text, at timestamptz, task text, queue text, args jsonb, priority smallint,
                    max_attempts integer)
    ), fresh AS (
        INSERT INTO {schema}.schedule_runs (schedule, occurrence, job_id, manual)
        SELECT name, at, id, %(manual)s FROM occ
        ON CONFLICT (schedule, occurrence) DO NOTHING
        RETURNING job_id
    )
    INSERT INTO {schema}.outbox (id, queue, task, args, priority, max_attempts, headers)
    OVERRIDING SYSTEM VALUE
    SELECT o.id, o.queue, o.task, o.args, o.priority, o.max_attempts,
           jsonb_build_object('schedule', o.name, 'occurrence', o.at)
      FROM occ o JOIN fresh f ON f.job_id = o.id
    RETURNING id, queue, task, headers->>'schedule' AS schedule
    """

    # Rows as one JSON array (jsonb_to_recordset): 10,000 schedules cost one string
    # parameter instead of five arrays built item by item.
    SCHEDULE_ADVANCE: LiteralString = """
    UPDATE {schema}.schedules s
       SET cursor_at = u.cursor_at, next_run_at = u.next_run_at,
           last_run_at = coalesce(u.last_run_at, s.last_run_at), last_job_id = coalesce(u.last_job_id, s.last_job_id)
      FROM jsonb_to_recordset(%(rows)s::jsonb)
           AS u(name text, cursor_at timestamptz, next_run_at timestamptz, last_run_at timestamptz, last_job_id bigint)
     WHERE s.name = u.name
    """

    SCHEDULE_NEXT_DUE: LiteralString = """
    SELECT min(next_run_at), now() FROM {schema}.schedules WHERE NOT paused AND removed_at IS NULL
    """

    SCHEDULE_RUN_DELETE_OLD: LiteralString = """
    DELETE FROM {schema}.schedule_runs
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM {schema}.schedule_runs
                             WHERE enqueued_at < now() - make_interval(secs => %(age)s::float8)
                             LIMIT %(limit)s))
    """

    SCHEDULE_LIST: LiteralString = """
    SELECT s.name, s.task, s.queue, s.priority, s.cron, s.every_seconds, s.tz, s.args, s.catch_up,
           s.max_catch_up, s.grace_seconds, s.paused, s.removed_at, s.next_run_at, s.last_run_at,
           s.last_job_id, o.state AS last_job_state, s.created_at, s.updated_at
      FROM {schema}.schedules s LEFT JOIN {schema}.outbox o ON o.id = s.last_job_id
     WHERE (%(name)s::text IS NULL OR s.name = %(name)s)
     ORDER BY s.name
    """

    SCHEDULE_LOCK: LiteralString = """
    SELECT name, task, queue, priority, max_attempts, args::text AS args, paused, removed_at
      FROM {schema}.schedules WHERE name = %(name)s FOR UPDATE
    """

    # Resume: occurrences that fell while paused are skipped; the leader computes the
    # next one at its next look (next_run_at = now()).
    SCHEDULE_SET_PAUSED: LiteralString = """
    UPDATE {schema}.schedules
       SET paused = %(paused)s, updated_at = now(),
           cursor_at = CASE WHEN paused AND NOT %(paused)s THEN greatest(cursor_at, now()) ELSE cursor_at END,
           next_run_at = CASE WHEN paused AND NOT %(paused)s THEN now() ELSE next_run_at END
     WHERE name = %(name)s
    """

    SCHEDULE_SET_LAST: LiteralString = """
    UPDATE {schema}.schedules SET last_run_at = %(at)s, last_job_id = %(job)s WHERE name = %(name)s
    """

    # --- workflows, workflow_edges, workflow_joins (postbox.workflow; docs/workflows.md) -----------
    # A workflow's jobs are outbox rows with workflow_id; those with upstream jobs start
    # 'waiting' (never published) with waiting_on counters. The release of a job's
    # dependents is not here: migration 0009's triggers run it inside the statement
    # that ends the job, whichever of the statements above it is.

    WORKFLOW_INSERT: LiteralString = """
    INSERT INTO {schema}.workflows (name, on_failure, jobs) VALUES (%(name)s, %(on_failure)s, %(jobs)s)
    RETURNING id
    """

    # The jobs of one workflow, with the ids drawn by JOB_NEXT_IDS; ``waiting_on`` is NULL
    # for a job that waits for nothing (it is inserted pending).
    JOB_COPY_OF_WORKFLOW: LiteralString = """
    COPY {schema}.outbox (id, queue, task, args, priority, available_at, max_attempts, headers,
                 expires_at, timeout_seconds, keep_result, workflow_id, state, waiting_on) FROM STDIN
    """

    WORKFLOW_EDGE_COPY: LiteralString = """
    COPY {schema}.workflow_edges (parent_id, child_id, workflow_id, shard, on_failure) FROM STDIN
    """

    WORKFLOW_JOIN_COPY: LiteralString = """
    COPY {schema}.workflow_joins (job_id, shard, remaining) FROM STDIN
    """

    # What a job of a workflow reads of its upstream jobs (ctx.upstream()).
    WORKFLOW_EDGE_LIST_UPSTREAM: LiteralString = """
    SELECT p.id, p.task, p.state, p.keep_result, p.result::text, p.last_error_class, p.last_error,
           e.on_failure, e.failure::text
      FROM {schema}.workflow_edges e JOIN {schema}.outbox p ON p.id = e.parent_id
     WHERE e.child_id = %(id)s
     ORDER BY p.id
    """

    # Kept results of succeeded upstream jobs still being written: a ctx.transaction()
    # job's return value is stored just after its commit, which released its dependents.
    WORKFLOW_COUNT_RESULTS_UNWRITTEN: LiteralString = """
    SELECT count(*) FROM {schema}.workflow_edges e JOIN {schema}.outbox p ON p.id = e.parent_id
     WHERE e.child_id = %(id)s AND p.state = 'succeeded' AND p.keep_result AND p.result IS NULL
       AND p.result_expires_at IS NULL AND p.finished_at > now() - make_interval(secs => %(within)s)
    """

    # A workflow with its jobs counted by state, and its status: running while a job
    # has not ended; then succeeded, failed (a job dead or expired) or cancelled.
    _WORKFLOW_WITH_COUNTS: LiteralString = """
    SELECT w.id, w.name, w.on_failure, w.jobs, w.created_at, w.cancelled_at, w.retried_at,
           c.counts, c.finished_at,
           CASE WHEN coalesce((c.counts->>'waiting')::int, 0) + coalesce((c.counts->>'pending')::int, 0)
                     + coalesce((c.counts->>'queued')::int, 0) + coalesce((c.counts->>'running')::int, 0)
                     + coalesce((c.counts->>'retrying')::int, 0) > 0 THEN 'running'
                WHEN coalesce((c.counts->>'dead')::int, 0) + coalesce((c.counts->>'expired')::int, 0) > 0
                     THEN 'failed'
                WHEN coalesce((c.counts->>'cancelled')::int, 0) > 0 THEN 'cancelled'
                ELSE 'succeeded' END AS status
      FROM {schema}.workflows w
     CROSS JOIN LATERAL (
           SELECT coalesce(jsonb_object_agg(s.state, s.n), '{{}}'::jsonb) AS counts, max(s.last) AS finished_at
             FROM (SELECT o.state, count(*) AS n, max(o.finished_at) AS last
                     FROM {schema}.outbox o WHERE o.workflow_id = w.id GROUP BY o.state) s
     ) c
    """

    WORKFLOW_GET: LiteralString = (
        _WORKFLOW_WITH_COUNTS
        + """
     WHERE w.id = %(id)s
    """
    )

    WORKFLOW_LIST: LiteralString = (
        """
    SELECT * FROM ("""
        + _WORKFLOW_WITH_COUNTS
        + """
     WHERE (%(before)s::int8 IS NULL OR w.id < %(before)s::int8)
       AND (%(name)s::text IS NULL OR w.name = %(name)s::text)
    ) AS listed
     WHERE %(status)s::text IS NULL OR status = %(status)s::text
     ORDER BY id DESC LIMIT %(limit)s
    """
    )

    WORKFLOW_LOCK: LiteralString = """
    SELECT id FROM {schema}.workflows WHERE id = %(id)s FOR UPDATE
    """

    JOB_LIST_OF_WORKFLOW: LiteralString = """
    SELECT id, task, queue, state, attempts, max_attempts, waiting_on, created_at, started_at, finished_at,
           released_at, last_error_class, last_error
      FROM {schema}.outbox WHERE workflow_id = %(id)s ORDER BY id
    """

    WORKFLOW_EDGE_LIST: LiteralString = """
    SELECT parent_id, child_id, on_failure, failure::text FROM {schema}.workflow_edges
     WHERE workflow_id = %(id)s ORDER BY parent_id, child_id
    """

    # Cancel every job of a workflow that has not started; locked in id order. The
    # release trigger cancels (or counts down) their dependents in the same statement.
    JOB_CANCEL_OF_WORKFLOW: LiteralString = """
    WITH locked AS MATERIALIZED (
        SELECT ctid FROM {schema}.outbox
         WHERE workflow_id = %(id)s AND state IN ('waiting', 'pending', 'queued', 'retrying')
         ORDER BY id
           FOR UPDATE
    )
    UPDATE {schema}.outbox
       SET state = 'cancelled', finished_at = now(), waiting_on = NULL,
           cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM locked))
    RETURNING id
    """

    # Its running jobs are asked to stop (cooperative, as JOB_REQUEST_CANCEL).
    JOB_REQUEST_CANCEL_OF_WORKFLOW: LiteralString = """
    UPDATE {schema}.outbox SET cancel_requested_at = coalesce(cancel_requested_at, now())
     WHERE workflow_id = %(id)s AND state = 'running'
    RETURNING id
    """

    WORKFLOW_SET_CANCELLED: LiteralString = """
    UPDATE {schema}.workflows SET cancelled_at = coalesce(cancelled_at, now()) WHERE id = %(id)s
    """

    # Retry: every job of the workflow locked (id order), its dead, cancelled and expired
    # jobs waiting again with a fresh budget and their end uncounted, the recorded failures
    # cleared, then every waiting job's counters recounted from its parents' states (a
    # parent that has not succeeded will end again and count then), and those waiting
    # for nothing made pending (the relay publishes them).
    JOB_LOCK_OF_WORKFLOW: LiteralString = """
    SELECT id FROM {schema}.outbox WHERE workflow_id = %(id)s ORDER BY id FOR UPDATE
    """

    JOB_RESET_FAILED_OF_WORKFLOW: LiteralString = """
    UPDATE {schema}.outbox
       SET state = 'waiting', attempts = 0, available_at = now(), published_at = NULL, stream_id = NULL,
           claimed_by = NULL, lease_until = NULL, started_at = NULL, finished_at = NULL, discarded_at = NULL,
           cancel_requested_at = NULL, result = NULL, result_expires_at = NULL, released_at = NULL
     WHERE workflow_id = %(id)s AND state IN ('dead', 'cancelled', 'expired')
    RETURNING id
    """

    WORKFLOW_EDGE_CLEAR_FAILURES: LiteralString = """
    UPDATE {schema}.workflow_edges SET failure = NULL WHERE workflow_id = %(id)s AND failure IS NOT NULL
    """

    WORKFLOW_JOIN_RECOUNT: LiteralString = """
    UPDATE {schema}.workflow_joins j
       SET remaining = (SELECT count(*) FROM {schema}.workflow_edges e JOIN {schema}.outbox p ON p.id = e.parent_id
                         WHERE e.child_id = j.job_id AND e.shard = j.shard AND p.released_at IS NULL)
     WHERE j.job_id IN (SELECT id FROM {schema}.outbox WHERE workflow_id = %(id)s AND state = 'waiting')
    """

    JOB_RECOUNT_WAITING_OF_WORKFLOW: LiteralString = """
    WITH counts AS (
        SELECT o.id,
               (SELECT count(*) FROM {schema}.workflow_edges e JOIN {schema}.outbox p ON p.id = e.parent_id
                 WHERE e.child_id = o.id AND e.shard IS NULL AND p.released_at IS NULL)
               + (SELECT count(*) FROM {schema}.workflow_joins j WHERE j.job_id = o.id AND j.remaining > 0) AS n
          FROM {schema}.outbox o
         WHERE o.workflow_id = %(id)s AND o.state = 'waiting'
    )
    UPDATE {schema}.outbox o
       SET waiting_on = c.n, state = CASE WHEN c.n = 0 THEN 'pending' ELSE 'waiting' END
      FROM counts c WHERE o.id = c.id
    RETURNING o.id, o.state
    """

    # The gauges of /metrics: workflows with a job not ended, and the waiting jobs by queue.
    WORKFLOW_COUNT_ACTIVE: LiteralString = """
    SELECT count(DISTINCT workflow_id) FROM {schema}.outbox
     WHERE workflow_id IS NOT NULL AND state IN ('waiting', 'pending', 'queued', 'running', 'retrying')
    """

    JOB_COUNT_WAITING_BY_QUEUE: LiteralString = """
    SELECT queue, count(*) FROM {schema}.outbox WHERE state = 'waiting' GROUP BY queue ORDER BY queue
    """

    WORKFLOW_SET_RETRIED: LiteralString = """
    UPDATE {schema}.workflows SET retried_at = now(), cancelled_at = NULL, ended_at = NULL WHERE id = %(id)s
    """

    # A dead letter of a workflow requeued (postbox.app.services.dlq): its end is counted
    # again, and the jobs its death cancelled (by a 'cancel' edge, down a chain of such
    # cancels) wait for it again, when nothing else that failed still cancels them
    # (postbox.workflow.resumable). JOB_LIST_CANCELLED_DOWNSTREAM reads what that decision
    # needs: every edge into each job its death cancelled, with the parent's state.
    JOB_GET_WORKFLOW_ID: LiteralString = """
    SELECT workflow_id FROM {schema}.outbox WHERE id = %(id)s
    """

    JOB_LIST_CANCELLED_DOWNSTREAM: LiteralString = """
    WITH RECURSIVE down(id) AS (
        SELECT %(id)s::int8
        UNION
        SELECT e.child_id FROM down d JOIN {schema}.workflow_edges e ON e.parent_id = d.id
          JOIN {schema}.outbox c ON c.id = e.child_id
         WHERE c.state = 'cancelled' AND c.last_error_class = 'UpstreamFailed'
    )
    SELECT e.child_id, e.parent_id, e.on_failure, p.state, p.last_error_class
      FROM {schema}.workflow_edges e JOIN {schema}.outbox p ON p.id = e.parent_id
     WHERE e.child_id IN (SELECT id FROM down WHERE id <> %(id)s::int8)
     ORDER BY e.child_id, e.parent_id
    """

    JOB_RESUME_CANCELLED: LiteralString = """
    UPDATE {schema}.outbox
       SET state = 'waiting', attempts = 0, available_at = now(), published_at = NULL, stream_id = NULL,
           claimed_by = NULL, lease_until = NULL, started_at = NULL, finished_at = NULL, discarded_at = NULL,
           cancel_requested_at = NULL, result = NULL, result_expires_at = NULL, released_at = NULL
     WHERE id = ANY(%(ids)s::int8[]) AND state = 'cancelled'
    RETURNING id
    """

    JOB_CLEAR_RELEASED: LiteralString = """
    UPDATE {schema}.outbox SET released_at = NULL WHERE id = %(id)s
    """

    WORKFLOW_EDGE_CLEAR_FAILURES_OF_PARENTS: LiteralString = """
    UPDATE {schema}.workflow_edges SET failure = NULL WHERE parent_id = ANY(%(ids)s::int8[]) AND failure IS NOT NULL
    """

    WORKFLOW_CLEAR_ENDED: LiteralString = """
    UPDATE {schema}.workflows SET ended_at = NULL WHERE id = %(id)s
    """

    # Workflow events (postbox.relay.workflow_events): migration 0012's trigger NOTIFYs
    # releases and cascade cancels on postbox_workflow; the ends of jobs come on
    # postbox_results (the workers' outcome batches and claims).
    WORKFLOW_LISTEN: LiteralString = "LISTEN postbox_workflow"
    RESULTS_LISTEN: LiteralString = "LISTEN postbox_results"

    JOB_LIST_WORKFLOW_IDS: LiteralString = """
    SELECT DISTINCT workflow_id FROM {schema}.outbox WHERE id = ANY(%(ids)s::int8[]) AND workflow_id IS NOT NULL
    """

    WORKFLOW_LIST_UNENDED: LiteralString = """
    SELECT id FROM {schema}.workflows WHERE ended_at IS NULL AND id > %(after)s ORDER BY id LIMIT %(limit)s
    """

    # Marks ended, once, those of these workflows whose jobs have all ended, with the status
    # _WORKFLOW_WITH_COUNTS gives them, in one transaction: the first statement locks those
    # that look ended (one locked by a retry or a requeue is skipped: that transaction sets
    # it running, or the next hint or sweep checks it again); the second, whose snapshot is
    # taken with the locks held, sees any retry committed before and decides. A workflow's
    # jobs are probed newest first: its last jobs (a fan-in's callback, a chain's tail) end
    # last, so a running workflow is seen running at the first row, not after its ended ones.
    WORKFLOW_LOCK_ENDED: LiteralString = """
    SELECT w.id FROM {schema}.workflows w
     WHERE w.id = ANY(%(ids)s::int8[]) AND w.ended_at IS NULL
       AND (SELECT o.id FROM {schema}.outbox o
             WHERE o.workflow_id = w.id AND o.state IN ('waiting', 'pending', 'queued', 'running', 'retrying')
             ORDER BY o.id DESC LIMIT 1) IS NULL
     ORDER BY w.id
       FOR UPDATE SKIP LOCKED
    """

    WORKFLOW_MARK_ENDED: LiteralString = """
    WITH ended AS (
        UPDATE {schema}.workflows w SET ended_at = clock_timestamp()
         WHERE w.id = ANY(%(ids)s::int8[]) AND w.ended_at IS NULL
           AND (SELECT o.id FROM {schema}.outbox o
                 WHERE o.workflow_id = w.id AND o.state IN ('waiting', 'pending', 'queued', 'running', 'retrying')
                 ORDER BY o.id DESC LIMIT 1) IS NULL
        RETURNING w.id, w.name, w.jobs
    )
    SELECT e.id, e.name, e.jobs,
           CASE WHEN bool_or(o.state IN ('dead', 'expired')) THEN 'failed'
                WHEN bool_or(o.state = 'cancelled') THEN 'cancelled'
                ELSE 'succeeded' END AS status
      FROM ended e JOIN {schema}.outbox o ON o.workflow_id = e.id
     GROUP BY e.id, e.name, e.jobs
     ORDER BY e.id
    """

    # --- audit_log --------------------------------------------------------------------------------

    AUDIT_INSERT: LiteralString = """
    INSERT INTO {schema}.audit_log (actor, action, target, request_id, details)
    VALUES (%(actor)s, %(action)s, %(target)s, %(request_id)s, %(details)s::jsonb)
    RETURNING id, at
    """

    AUDIT_LIST: LiteralString = """
    SELECT id, at, actor, action, target, request_id, details FROM {schema}.audit_log
     WHERE (%(before)s::bigint IS NULL OR id < %(before)s)
     ORDER BY id DESC LIMIT %(limit)s
    """

    # --- sessions: dashboard logins (postbox.app.services.sessions) --------------------------------

    SESSION_INSERT: LiteralString = """
    INSERT INTO {schema}.sessions (token_hash, key_fingerprint, client, user_agent, expires_at)
    VALUES (%(token_hash)s, %(key_fingerprint)s, %(client)s, %(user_agent)s,
            now() + make_interval(secs => %(ttl)s))
    RETURNING id, expires_at
    """

    # The live session of a token; its last_seen_at refreshed when older than a minute
    # (a dashboard's requests write at most once a minute).
    SESSION_TOUCH: LiteralString = """
    WITH found AS (
        SELECT id, key_fingerprint, last_seen_at FROM {schema}.sessions
         WHERE token_hash = %(token_hash)s AND expires_at > now()
    ), touched AS (
        UPDATE {schema}.sessions s SET last_seen_at = now()
          FROM found WHERE s.id = found.id AND found.last_seen_at < now() - interval '60 seconds'
    )
    SELECT id, key_fingerprint FROM found
    """

    SESSION_LIST: LiteralString = """
    SELECT id, token_hash, key_fingerprint, client, user_agent, created_at, last_seen_at, expires_at
      FROM {schema}.sessions WHERE expires_at > now() ORDER BY id DESC LIMIT %(limit)s
    """

    SESSION_DELETE: LiteralString = """
    DELETE FROM {schema}.sessions WHERE id = %(id)s RETURNING id
    """

    SESSION_DELETE_TOKEN: LiteralString = """
    DELETE FROM {schema}.sessions WHERE token_hash = %(token_hash)s RETURNING id
    """

    SESSION_DELETE_ALL: LiteralString = """
    DELETE FROM {schema}.sessions RETURNING id
    """

    SESSION_PRUNE: LiteralString = """
    DELETE FROM {schema}.sessions WHERE expires_at <= now()
    """

    # --- alembic_version: the schema revision -----------------------------------------------------

    MIGRATION_VERSION: LiteralString = """
    SELECT version_num FROM {schema}.alembic_version
    """

    MIGRATION_TABLE_EXISTS: LiteralString = """
    SELECT to_regclass('{schema}.alembic_version') IS NOT NULL
    """

    # Empty every table of the schema but the migration version (postbox.django's flush:
    # a Django test database's flush empties postbox's tables with Django's). Identities
    # are not restarted: a producer may hold ids drawn ahead (postbox.ids). No schema: nothing.
    SCHEMA_TRUNCATE_ALL: LiteralString = """
    DO $truncate$
    DECLARE
        tables text;
    BEGIN
        SELECT string_agg(c.oid::regclass::text, ', ') INTO tables
          FROM pg_class c
         WHERE c.relnamespace = to_regnamespace('{schema}') AND c.relkind IN ('r', 'p')
           AND NOT c.relispartition AND c.relname <> 'alembic_version';
        IF tables IS NOT NULL THEN
            EXECUTE 'TRUNCATE ' || tables || ' CASCADE';
        END IF;
    END
    $truncate$
    """

    # --- no table: notifications, the clock, transaction settings ---------------------------------

    OUTBOX_LISTEN: LiteralString = "LISTEN postbox_outbox"

    OUTBOX_NOTIFY: LiteralString = "SELECT pg_notify('postbox_outbox', '')"

    # Wake the result waiters of these ended jobs, and the relay for those of a workflow: only the
    # jobs that have either are named (notify_results(), migration 0014); no NOTIFY when none has.
    RESULTS_NOTIFY: LiteralString = "SELECT {schema}.notify_results(%(ids)s::int8[])"

    DATABASE_NOW: LiteralString = "SELECT now()"

    # A session's bounds (postbox.db.SessionBounds), for the session or (local) its open
    # transaction only: idle in a transaction, lock waits, statement time, in milliseconds.
    SESSION_SET_BOUNDS: LiteralString = """
    SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, %(local)s),
           set_config('lock_timeout', %(lock_ms)s, %(local)s),
           set_config('statement_timeout', %(statement_ms)s, %(local)s)
    """

    # A tick's transaction may not outlive the lock session's own idle limit: a leader
    # frozen inside it is cut off (and its lock freed) as if it were frozen while idle.
    TRANSACTION_SET_IDLE_TIMEOUT: LiteralString = """
    SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)
    """

    # --- job control: snooze, progress, moving waiting jobs (docs/job-control.md) ------------------

    # The snoozes of a job's current life (an archived earlier life's attempts are below zero):
    # what postbox.outcomes.snoozed bounds. Read by the claimant of the running attempt, which
    # no one else may record, so the count cannot change under it.
    JOB_ATTEMPT_COUNT_SNOOZES: LiteralString = """
    SELECT count(*) FROM {schema}.job_attempts WHERE outbox_id = %(id)s AND attempt > 0 AND outcome = 'snoozed'
    """

    # A run's progress (postbox.progress), stamped with the attempt and the moment it is
    # written. Fenced by the attempt: a run taken over (attempts moved on) writes nothing.
    # Its claim may already be gone (NULL) when the last value is written after a success
    # committed inside ctx.transaction(); never another worker's.
    # A debounced task's arguments as the claimed run must use them (postbox.unique.debounce):
    # an enqueue of the key may have replaced them after the job was published, until the
    # claim; none can after it (the run's fence: this attempt, this worker, running).
    JOB_GET_ARGS_OF_ATTEMPT: LiteralString = """
    SELECT args::text FROM {schema}.outbox
     WHERE id = %(id)s AND attempts = %(attempt)s AND claimed_by = %(worker)s AND state = 'running'
    """

    # Move waiting jobs (app/services/moves.py): a new priority and/or due time for the
    # pending, queued or retrying rows named by id and/or matching the filter, locked in id
    # order (as claims lock them; a row a worker claimed meanwhile fails the lock's recheck
    # and is left alone). A published row goes back to pending, unpublished: the relay
    # publishes it again, once, to the stream of its new priority when it is due (its old
    # entry is dropped after the commit, or skipped by the claim when not due).
    JOB_MOVE_WAITING: LiteralString = """
    WITH target AS (
        SELECT o.id, o.priority AS old_priority, o.available_at AS old_available_at,
               o.published_at IS NOT NULL AS was_published, o.stream_id AS old_stream_id
          FROM {schema}.outbox o
         WHERE o.state IN ('pending', 'queued', 'retrying') AND o.claimed_by IS NULL
           AND (%(ids)s::int8[] IS NULL OR o.id = ANY(%(ids)s::int8[]))
           AND (%(queue)s::text IS NULL OR o.queue = %(queue)s::text)
           AND (%(task)s::text IS NULL OR o.task = %(task)s::text)
           AND (%(state)s::text IS NULL OR o.state = %(state)s::text)
         ORDER BY o.id
         LIMIT %(limit)s
           FOR UPDATE OF o
    )
    UPDATE {schema}.outbox o
       SET priority = coalesce(%(priority)s::int, o.priority),
           available_at = coalesce(%(run_at)s::timestamptz,
                                   now() + make_interval(secs => %(delay)s::float8),
                                   o.available_at),
           state = CASE WHEN o.state = 'queued' THEN 'pending' ELSE o.state END,
           published_at = NULL,
           stream_id = NULL
      FROM target t
     WHERE o.id = t.id
    RETURNING o.id, o.queue, o.task, o.state, o.priority, o.available_at, t.old_priority, t.old_available_at,
              t.was_published, t.old_stream_id
    """

    JOB_GET_STATES: LiteralString = """
    SELECT id, state FROM {schema}.outbox WHERE id = ANY(%(ids)s::int8[])
    """

    # Encrypted tasks' args sealed under another key than the current one (postbox.encryption),
    # by id from a cursor: what `postbox encryption reencrypt` seals again.
    JOB_LIST_SEALED_WITH_OTHER_KEY: LiteralString = """
    SELECT id, task, args::text FROM {schema}.outbox
     WHERE id > %(after)s AND args ? '$postbox_encrypted'
       AND args -> '$postbox_encrypted' ->> 'kid' IS DISTINCT FROM %(kid)s
     ORDER BY id
     LIMIT %(limit)s
    """

    # One row's args sealed again, only if they are still what was read (compare-and-set).
    JOB_SET_SEALED_ARGS: LiteralString = """
    UPDATE {schema}.outbox SET args = %(new)s::jsonb WHERE id = %(id)s AND args = %(old)s::jsonb
    """

    # Kept results of encrypted tasks sealed under another key than the current one (rotation), by id.
    JOB_LIST_SEALED_RESULTS_WITH_OTHER_KEY: LiteralString = """
    SELECT id, result::text FROM {schema}.outbox
     WHERE id > %(after)s AND result ? '$postbox_encrypted'
       AND result -> '$postbox_encrypted' ->> 'kid' IS DISTINCT FROM %(kid)s
     ORDER BY id
     LIMIT %(limit)s
    """

    # One row's result sealed again, only if it is still what was read (compare-and-set).
    JOB_SET_SEALED_RESULT: LiteralString = """
    UPDATE {schema}.outbox SET result = %(new)s::jsonb WHERE id = %(id)s AND result = %(old)s::jsonb
    """

    JOB_SET_PROGRESS: LiteralString = """
    UPDATE {schema}.outbox
       SET progress = %(progress)s::jsonb
                      || jsonb_build_object('attempt', attempts, 'at', clock_timestamp())
     WHERE id = %(id)s AND attempts = %(attempt)s AND (claimed_by = %(worker)s OR claimed_by IS NULL)
    RETURNING progress
    """


@functools.cache
def statements(schema_name: str) -> Statements:
    """The statements rendered for ``schema_name`` (validated), built once per schema."""
    return Statements(schema.validate(schema_name))


def active() -> Statements:
    """The statements for this process's schema (:func:`postbox.schema.active`)."""
    return statements(schema.active())
