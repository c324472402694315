"""Every statement on the outbox (and its side tables), named, parameters only.

One place per table: producers, the relay, workers and the API all take their
SQL from here, so a reader sees every way a row can change in one file.
Statements are ``LiteralString`` so a type checker refuses SQL built at runtime.
Sections: producer, relay, worker, operations.
"""

from __future__ import annotations

from typing import LiteralString

# --- producer ------------------------------------------------------------------

INSERT_JOB: LiteralString = """
INSERT INTO outbox (queue, task, args, priority, available_at, max_attempts, dedup_key, headers,
                    expires_at, timeout_seconds, keep_result)
VALUES (%(queue)s, %(task)s, %(args)s::jsonb, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
        %(max_attempts)s, %(dedup_key)s, %(headers)s::jsonb,
        %(expires_at)s::timestamptz, %(timeout)s::float8, %(keep_result)s)
ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
RETURNING id
"""

SELECT_DEDUP: LiteralString = """
SELECT id FROM outbox WHERE queue = %(queue)s AND dedup_key = %(dedup_key)s
"""

INSERT_JOBS_BULK: LiteralString = """
INSERT INTO outbox (queue, task, args, priority, available_at, max_attempts, dedup_key, headers,
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

SELECT_DEDUP_MANY: LiteralString = """
SELECT id, queue, dedup_key FROM outbox
 WHERE (queue, dedup_key) IN (SELECT * FROM unnest(%(queue)s::text[], %(dedup_key)s::text[]))
"""

SELECT_JOB: LiteralString = """
SELECT id, queue, task, args, priority, state, attempts, max_attempts, available_at, created_at,
       published_at, started_at, finished_at, expires_at, dedup_key, headers, keep_result, result,
       last_error, last_error_class, cancel_requested_at, discarded_at
  FROM outbox WHERE id = %(id)s
"""

SELECT_RESULT: LiteralString = """
SELECT state, result, last_error_class, last_error FROM outbox WHERE id = %(id)s
"""

# --- relay -----------------------------------------------------------------------
# (owned by relay/: publish scan, mark published, republish after Redis loss)
# Every relay statement runs on the leader's own session (the one holding the
# advisory lock), so a lost session cannot mark anything.

RELAY_LISTEN: LiteralString = "LISTEN postbox_outbox"

RELAY_TRY_LOCK: LiteralString = "SELECT pg_try_advisory_lock(%(key)s)"

RELAY_UNLOCK: LiteralString = "SELECT pg_advisory_unlock(%(key)s)"

RELAY_REGISTER: LiteralString = """
INSERT INTO relays (id, host, pid, role, term) VALUES (%(id)s, %(host)s, %(pid)s, %(role)s, 0)
ON CONFLICT (id) DO UPDATE SET role = excluded.role, last_seen = now()
"""

RELAY_SET_ROLE: LiteralString = """
UPDATE relays SET role = %(role)s, last_seen = now() WHERE id = %(id)s
"""

# A new leader takes the next term: one more than any term ever recorded.
RELAY_BECOME_LEADER: LiteralString = """
UPDATE relays SET role = 'leader', last_seen = now(),
       term = (SELECT coalesce(max(term), 0) + 1 FROM relays)
 WHERE id = %(id)s
RETURNING term
"""

RELAY_HEARTBEAT: LiteralString = "UPDATE relays SET last_seen = now() WHERE id = %(id)s"

# Due, unpublished rows in id order. Never a "last id" cursor: a transaction
# that commits late carries a lower id, and this scan still finds it.
RELAY_SELECT_DUE: LiteralString = """
SELECT id, queue, task, args::text, headers::text, priority, attempts,
       (extract(epoch FROM created_at) * 1000)::int8 AS enq_ms,
       coalesce(expires_at < now(), false) AS expired
  FROM outbox
 WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
 ORDER BY id
 LIMIT %(limit)s
"""

# One statement for the whole batch; a row a worker already claimed (it set
# published_at) is left alone.
RELAY_MARK_PUBLISHED: LiteralString = """
UPDATE outbox AS o
   SET state = 'queued', published_at = now(), publish_count = o.publish_count + 1, stream_id = u.sid
  FROM unnest(%(ids)s::int8[], %(sids)s::text[]) AS u(id, sid)
 WHERE o.id = u.id AND o.published_at IS NULL AND o.state IN ('pending', 'retrying')
"""

RELAY_MARK_EXPIRED: LiteralString = """
UPDATE outbox SET state = 'expired', finished_at = now()
 WHERE id = ANY(%(ids)s::int8[]) AND published_at IS NULL AND state IN ('pending', 'retrying')
   AND expires_at < now()
"""

# Seconds until the next delayed row is due (NULL: none waiting).
RELAY_NEXT_DUE: LiteralString = """
SELECT extract(epoch FROM min(available_at) - now())::float8
  FROM outbox
 WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at > now()
"""

RELAY_BACKLOG: LiteralString = """
SELECT count(*), coalesce(extract(epoch FROM now() - min(available_at))::float8, 0)
  FROM outbox
 WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
"""

RELAY_NOW: LiteralString = "SELECT now()"

# After Redis lost its data: rows published before the loss was noticed and not
# finished (queued, or running under a claim that went stale), by id from a cursor.
RELAY_SELECT_LOST: LiteralString = """
SELECT id, queue, task, args::text, headers::text, priority, attempts,
       (extract(epoch FROM created_at) * 1000)::int8 AS enq_ms
  FROM outbox
 WHERE id > %(after)s
   AND ((state = 'queued' AND published_at <= %(cutoff)s)
        OR (state = 'running' AND lease_until < now()))
 ORDER BY id
 LIMIT %(limit)s
"""

# Candidates for the "is its entry still there" sweep: published rows without an
# outcome that have waited a while (queued), or whose claim went stale (running).
RELAY_SELECT_INFLIGHT: LiteralString = """
SELECT id, queue, task, args::text, headers::text, priority, attempts,
       (extract(epoch FROM created_at) * 1000)::int8 AS enq_ms, stream_id
  FROM outbox
 WHERE id > %(after)s AND stream_id IS NOT NULL
   AND ((state = 'queued' AND published_at < now() - make_interval(secs => %(min_age)s))
        OR (state = 'running' AND lease_until < now()))
 ORDER BY id
 LIMIT %(limit)s
"""

# The rows of a republish that still have no outcome, re-read right before the XADD.
RELAY_STILL_UNFINISHED: LiteralString = """
SELECT id FROM outbox
 WHERE id = ANY(%(ids)s::int8[])
   AND (state = 'queued' OR (state = 'running' AND lease_until < now()))
"""

# Record a republish; only a row still without an outcome is touched.
RELAY_MARK_REPUBLISHED: LiteralString = """
UPDATE outbox AS o
   SET published_at = CASE WHEN o.state = 'queued' THEN now() ELSE o.published_at END,
       publish_count = o.publish_count + 1, stream_id = u.sid
  FROM unnest(%(ids)s::int8[], %(sids)s::text[]) AS u(id, sid)
 WHERE o.id = u.id AND o.state IN ('queued', 'running')
"""

# --- worker ----------------------------------------------------------------------
# (owned by worker/: claims, outcomes, leases, heartbeats)

# --- operations ------------------------------------------------------------------
# (owned by app/: listings, DLQ, queue control, audit, retention)
