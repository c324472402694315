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

# --- worker ----------------------------------------------------------------------
# (owned by worker/: claims, outcomes, leases, heartbeats)

# --- operations ------------------------------------------------------------------
# (owned by app/: listings, DLQ, queue control, audit, retention)
