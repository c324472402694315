"""The one table the dtq tasks write: ``dtq.counters``, the ``counter`` task's effect."""

from __future__ import annotations

import psycopg

SCHEMA = "dtq"

# Idempotent, and serialised by an advisory lock so two processes creating it at once both succeed.
CREATE = """
SELECT pg_advisory_xact_lock(hashtext('postbox_examples.dtq.schema'));
CREATE SCHEMA IF NOT EXISTS dtq;
CREATE TABLE IF NOT EXISTS dtq.counters (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
"""


def migrate(url: str) -> None:
    """Create the schema ``dtq`` and its table (a no-op when they exist)."""
    with psycopg.connect(url, autocommit=False) as conn:
        conn.execute(CREATE)


def count(conn: psycopg.Connection[tuple[object, ...]], name: str) -> int:
    """The ``counter`` task's value for ``name`` (0 before its first job)."""
    row = conn.execute("SELECT value FROM dtq.counters WHERE name = %s", (name,)).fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]
