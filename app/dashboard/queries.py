"""The dashboard's own reads, named, parameters only (rendered for the process's schema like ``postbox.sql``).

What the REST API already answers (queue stats, one job, workers, schedules) the
dashboard takes from it; these are the views it needs on top: the job search
with time range and text match on args, the bounded count behind "select all
matching", and the overview's last hour.
"""

from __future__ import annotations

import functools
from typing import LiteralString

from postbox import schema

# One WHERE clause for the search, its count and the bulk actions, so all three see the same rows.
_MATCH: LiteralString = """
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(state)s::text IS NULL OR state = %(state)s)
       AND (%(discarded)s::boolean IS NULL OR (discarded_at IS NOT NULL) = %(discarded)s)
       AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
       AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
       AND (%(text)s::text IS NULL OR args::text ILIKE %(text)s ESCAPE '\\')
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s))
       AND (%(id_from)s::bigint IS NULL OR id >= %(id_from)s)
       AND (%(id_below)s::bigint IS NULL OR id < %(id_below)s)
"""

_COLUMNS: LiteralString = """
    SELECT id, queue, task, priority, state, attempts, max_attempts, created_at, available_at, published_at,
           started_at, finished_at, expires_at, cancel_requested_at, discarded_at, dedup_key, keep_result,
           last_error_class, last_error, claimed_by
      FROM {schema}.outbox
"""


class DashboardStatements(schema.Templates):
    """Templates as class attributes; an instance holds them rendered for one schema."""

    SEARCH: LiteralString = (
        _COLUMNS
        + _MATCH
        + """
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
       AND (%(floor)s::bigint IS NULL OR id >= %(floor)s)
     ORDER BY id DESC
     LIMIT %(limit)s
    """
    )

    NEWEST_ID: LiteralString = """
    SELECT coalesce(max(id), 0) FROM {schema}.outbox
    """

    # The first id created at or after a time, by a binary search over the primary key (ids grow with
    # created_at): the values between lo and hi hold the answer; each step reads the first row at or
    # above the middle. ~20 index probes at 1M rows, where a created_at bound alone walks the table.
    # Gives max(id) + 1 when every row is older.
    ID_AT: LiteralString = """
    WITH RECURSIVE span AS (
        SELECT coalesce(min(id), 1) AS lo, coalesce(max(id), 0) + 1 AS hi FROM {schema}.outbox
        UNION ALL
        SELECT CASE WHEN p.id IS NULL OR p.created_at >= %(at)s THEN s.lo ELSE p.id + 1 END,
               CASE WHEN p.id IS NULL OR p.created_at >= %(at)s THEN s.mid ELSE s.hi END
          FROM (SELECT lo, hi, lo + (hi - lo) / 2 AS mid FROM span WHERE lo < hi) AS s
          LEFT JOIN LATERAL (SELECT o.id, o.created_at FROM {schema}.outbox o
                              WHERE o.id >= s.mid ORDER BY o.id LIMIT 1) AS p ON true
    )
    SELECT lo FROM span WHERE lo >= hi
    """

    # Ids matching the filter, newest first, at most ``limit``: the count and the bulk actions.
    MATCH_IDS: LiteralString = (
        """
    SELECT id FROM {schema}.outbox
    """
        + _MATCH
        + """
     ORDER BY id DESC
     LIMIT %(limit)s
    """
    )

    COUNT_CAPPED: LiteralString = (
        """
    SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox
    """
        + _MATCH
        + """
     LIMIT %(limit)s) AS capped
    """
    )

    # Every queue's counts, as JOB_COUNT_BY_QUEUE defines them, one queue at a time through the
    # (queue, state) index: the queue names by a skip scan, then each queue's unfinished and dead rows.
    # One statement over all queues is a sequential scan of the whole outbox (~200 ms at 1M rows).
    QUEUE_COUNTS: LiteralString = """
    WITH RECURSIVE names AS (
        (SELECT queue::text AS queue FROM {schema}.outbox ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT o.queue::text FROM {schema}.outbox o WHERE o.queue > n.queue ORDER BY o.queue LIMIT 1)
          FROM names n WHERE n.queue IS NOT NULL
    )
    SELECT n.queue, c.*
      FROM names n,
           LATERAL (
             SELECT count(*) FILTER (WHERE state IN ('pending', 'retrying') AND published_at IS NULL
                                       AND available_at <= now()) AS backlog,
                    count(*) FILTER (WHERE state = 'pending' AND available_at > now()) AS scheduled,
                    count(*) FILTER (WHERE state = 'queued') AS queued,
                    count(*) FILTER (WHERE state = 'running') AS in_flight,
                    count(*) FILTER (WHERE state = 'retrying') AS retrying,
                    count(*) FILTER (WHERE state = 'dead' AND discarded_at IS NULL) AS dead,
                    count(*) FILTER (WHERE state = 'dead' AND discarded_at IS NOT NULL) AS discarded,
                    extract(epoch FROM now() - min(available_at)
                        FILTER (WHERE state IN ('pending', 'queued', 'retrying') AND available_at <= now()))::float8
                        AS oldest_waiting_seconds
               FROM {schema}.outbox o
              WHERE o.queue = n.queue AND o.state IN ('pending', 'queued', 'running', 'retrying', 'dead')
           ) AS c
     WHERE n.queue IS NOT NULL
    """

    # Every queue name in the outbox, by a skip scan of the (queue, state) index. A state filter
    # without a queue is given them (queue = ANY(...)), so that index serves it: a rare state
    # is then found in milliseconds instead of walking the primary key through the whole table.
    QUEUE_NAMES: LiteralString = """
    WITH RECURSIVE names AS (
        (SELECT queue::text AS queue FROM {schema}.outbox ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT o.queue::text FROM {schema}.outbox o WHERE o.queue > n.queue ORDER BY o.queue LIMIT 1)
          FROM names n WHERE n.queue IS NOT NULL
    )
    SELECT queue FROM names WHERE queue IS NOT NULL
    """

    # The recursive statement's estimated cost makes PostgreSQL JIT-compile it: ~450 ms spent to save
    # nothing on a query that runs in ~20 ms. Off for the dashboard's read transaction only.
    NO_JIT: LiteralString = """
    SET LOCAL jit = off
    """

    QUEUE_ROWS: LiteralString = """
    SELECT name, paused FROM {schema}.queues
    """

    HEADERS: LiteralString = """
    SELECT headers FROM {schema}.outbox WHERE id = %(id)s
    """

    # Jobs finished per minute over the last hour, by outcome (outbox_finished index).
    FINISHED_PER_MINUTE: LiteralString = """
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead')) AS other
      FROM {schema}.outbox
     WHERE finished_at > date_trunc('minute', now()) - interval '59 minutes'
     GROUP BY 1 ORDER BY 1
    """

    # Commit-to-start latency of first attempts finished in the last hour.
    LATENCY: LiteralString = """
    SELECT count(*) AS jobs,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) AS p95
      FROM {schema}.outbox
     WHERE finished_at > now() - interval '1 hour' AND started_at IS NOT NULL AND attempts = 1
       AND started_at >= available_at
    """

    RELAYS: LiteralString = """
    SELECT id, host, pid, role, term, started_at, last_seen,
           extract(epoch FROM now() - last_seen)::float8 AS seen_seconds_ago
      FROM {schema}.relays
     WHERE role <> 'stopped'
     ORDER BY role = 'leader' DESC, last_seen DESC
    """

    # The relay's lag: how long the oldest due, unpublished job has waited (outbox_unpublished_due index).
    RELAY_LAG: LiteralString = """
    SELECT extract(epoch FROM now() - min(available_at))::float8 AS lag_seconds, count(*) AS unpublished
      FROM (SELECT available_at FROM {schema}.outbox
             WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
             ORDER BY available_at LIMIT 10001) AS due
    """


@functools.cache
def statements(schema_name: str) -> DashboardStatements:
    return DashboardStatements(schema.validate(schema_name))


def active() -> DashboardStatements:
    """The statements for this process's schema."""
    return statements(schema.active())
