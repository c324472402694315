"""Migrations go up, down and up again on an empty database, and the result is what the code expects."""

from __future__ import annotations

import psycopg
import pytest

from jobs import migrate

EXPECTED_TABLES = {
    "outbox",
    "processed_jobs",
    "job_attempts",
    "queues",
    "workers",
    "relays",
    "audit_log",
    "alembic_version",
}


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {name for (name,) in rows}


def test_up_down_up(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    after_first = tables(empty_database_url)
    assert EXPECTED_TABLES <= after_first
    migrate.downgrade(empty_database_url, "base")
    assert tables(empty_database_url) == {"alembic_version"}
    migrate.upgrade(empty_database_url)
    assert tables(empty_database_url) == after_first
    with psycopg.connect(empty_database_url) as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        states = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'outbox_state_check'"
        ).fetchone()[0]  # type: ignore[index]
    for state in ("pending", "queued", "running", "retrying", "succeeded", "dead", "cancelled", "expired"):
        assert f"'{state}'" in states


def test_0003_drops_the_attempts_key_and_its_downgrade_restores_it_without_orphans(empty_database_url: str) -> None:
    fk = "SELECT count(*) FROM pg_constraint WHERE conname = 'job_attempts_outbox_id_fkey'"
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert conn.execute(fk).fetchone() == (0,)
        conn.execute("INSERT INTO outbox (queue, task) VALUES ('default', 'noop')")
        conn.execute("INSERT INTO job_attempts (outbox_id, attempt) SELECT id, 1 FROM outbox")
        conn.execute("INSERT INTO job_attempts (outbox_id, attempt) VALUES (999999, 1)")  # an orphan
    migrate.downgrade(empty_database_url, "0002_stagedoor")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert conn.execute(fk).fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM job_attempts").fetchone() == (1,)
    migrate.upgrade(empty_database_url)


BAD_ROWS = [
    ("Bad Queue", "noop", "{}", "{}"),  # queue name
    ("default", "", "{}", "{}"),  # task name
    ("default", "noop", "[]", "{}"),  # args
    ("default", "noop", "{}", "1"),  # headers
]
INSERT_ROW = "INSERT INTO outbox (queue, task, args, headers) VALUES (%s, %s, %s::jsonb, %s::jsonb)"


def _rejected(url: str) -> list[str]:
    """The constraint named by each bad row's error (every one must fail as a check violation)."""
    names = []
    with psycopg.connect(url, autocommit=True) as conn:
        for row in BAD_ROWS:
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                conn.execute(INSERT_ROW, row)
            names.append(caught.value.diag.constraint_name or "")
        conn.execute(INSERT_ROW, ("default", "noop", "{}", "{}"))
        # An update that leaves the checked columns alone still works, with or without the domains.
        conn.execute("UPDATE outbox SET state = 'queued' WHERE task = 'noop'")
        conn.execute("DELETE FROM outbox")
    return names


def test_0004_checks_write_once_columns_as_domains_and_its_downgrade_restores_the_table_checks(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    assert _rejected(empty_database_url) == [
        "postbox_queue_name_check",
        "postbox_task_name_check",
        "postbox_json_object_check",
        "postbox_json_object_check",
    ]
    with psycopg.connect(empty_database_url) as conn:
        cur = conn.execute("SELECT queue, task, args, headers FROM outbox LIMIT 0")
        # Clients see the base types: args and headers still load as JSON.
        assert [d.type_code for d in cur.description or []] == [25, 25, 3802, 3802]
    migrate.downgrade(empty_database_url, "0003_attempts_without_fk")
    assert _rejected(empty_database_url) == [
        "outbox_queue_check",
        "outbox_task_check",
        "outbox_args_check",
        "outbox_headers_check",
    ]
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_type WHERE typname LIKE 'postbox\\_%%'").fetchone() == (0,)
    migrate.upgrade(empty_database_url)
