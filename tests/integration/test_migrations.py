"""postbox's migrations: up, down and up again, all inside postbox's own schema.

They create nothing outside that schema (``postbox``, or ``POSTBOX_SCHEMA``), keep
their version table there, leave an application's own tables and alembic
history alone, and the SQL of the code finds its tables whatever the
connection's ``search_path``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from postbox import enqueue, migrate, schema, sql
from postbox.settings import libpq_url
from tests.harness import databases
from tests.harness.servers import Servers
from tests.harness.tasks import core as tasks_core

EXPECTED_TABLES = {
    "outbox",
    "processed_jobs",
    "job_attempts",
    "queues",
    "workers",
    "relays",
    "audit_log",
    "tasks",
    "alembic_version",
    "schedules",
    "schedule_runs",
    "limits",
    "limit_slots",
    "limit_rates",
    "fair_queues",
    "sessions",
    "workflows",
    "workflow_edges",
    "workflow_joins",
    "result_waiters",
}

# What migration 0008 creates: a downgrade below it drops these too.
SESSION_OBJECTS = {
    ("postbox", "sessions", "r"),
    ("postbox", "sessions_pkey", "i"),
    ("postbox", "sessions_id_seq", "S"),
    ("postbox", "sessions_token_hash_key", "i"),
    ("postbox", "sessions_expires_at", "i"),
}

# What migration 0009 creates (columns and triggers are not objects of pg_class).
WORKFLOW_OBJECTS = {
    ("postbox", "workflows", "r"),
    ("postbox", "workflows_pkey", "i"),
    ("postbox", "workflows_id_seq", "S"),
    ("postbox", "workflow_edges", "r"),
    ("postbox", "workflow_edges_pkey", "i"),
    ("postbox", "workflow_edges_child", "i"),
    ("postbox", "workflow_edges_workflow", "i"),
    ("postbox", "workflow_joins", "r"),
    ("postbox", "workflow_joins_pkey", "i"),
    ("postbox", "outbox_workflow", "i"),
    ("postbox", "outbox_waiting", "i"),
    ("postbox", "workflow_job_ended", "function"),
    ("postbox", "workflow_release", "function"),
    ("postbox", "workflow_job_left_waiting", "function"),  # 0012's (workflow events): below 0009, gone too
}

# What migration 0012 creates (its column and trigger are not objects of pg_class).
WORKFLOW_EVENT_OBJECTS = {("postbox", "workflow_job_left_waiting", "function")}

# What migration 0013 creates: the claim, the outcome and the mark as functions.
PLAN_OBJECTS = {
    ("postbox", "claim_attempts", "function"),
    ("postbox", "record_outcomes", "function"),
    ("postbox", "mark_published", "function"),
}

# What migration 0014 creates: the result waiters and the notification that asks for them.
WAITER_OBJECTS = {
    ("postbox", "result_waiters", "r"),
    ("postbox", "result_waiters_pkey", "i"),
    ("postbox", "result_waiters_id_seq", "S"),
    ("postbox", "result_waiters_job", "i"),
    ("postbox", "notify_results", "function"),
}

# What migration 0021 creates: the relay's list of due rows, highest priority first.
PRIORITY_OBJECTS = {("postbox", "outbox_unpublished_priority", "i")}

# What migration 0011 creates (outbox_unpublished_id is rebuilt under its own name).
FAIR_OBJECTS = {
    ("postbox", "fair_queues", "r"),
    ("postbox", "fair_queues_pkey", "i"),
    ("postbox", "outbox_fair_waiting", "i"),
    ("postbox", "outbox_fair_inflight", "i"),
}

# Everything a database holds outside the system schemas, by kind.
OBJECTS = """
SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
UNION ALL
SELECT n.nspname, p.proname, 'function' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT n.nspname, t.typname, 'domain' FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE t.typtype = 'd' AND n.nspname NOT IN ('pg_catalog', 'information_schema')
"""


def objects(url: str) -> set[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        return set(conn.execute(OBJECTS).fetchall())  # type: ignore[arg-type]


def tables(url: str, in_schema: str = "postbox") -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (in_schema,)).fetchall()
    return {name for (name,) in rows}


@pytest.fixture
def other_schema() -> Iterator[str]:
    schema.use("shop_jobs")
    yield "shop_jobs"
    schema.reset()


def test_0002_schedules_downgrades_to_0001_dropping_only_its_own_tables(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0001_postbox")
    assert everything - objects(
        empty_database_url
    ) == SESSION_OBJECTS | WORKFLOW_OBJECTS | FAIR_OBJECTS | PLAN_OBJECTS | WAITER_OBJECTS | PRIORITY_OBJECTS | {
        ("postbox", "schedules", "r"),
        ("postbox", "schedules_pkey", "i"),
        ("postbox", "schedules_due", "i"),
        ("postbox", "schedule_runs", "r"),
        ("postbox", "schedule_runs_pkey", "i"),
        ("postbox", "schedule_runs_enqueued", "i"),
        ("postbox", "unique_claim", "function"),
        ("postbox", "outbox_unique_key", "i"),
        ("postbox", "limits", "r"),
        ("postbox", "limits_pkey", "i"),
        ("postbox", "limit_slots", "r"),
        ("postbox", "limit_slots_pkey", "i"),
        ("postbox", "limit_slots_job", "i"),
        ("postbox", "limit_rates", "r"),
        ("postbox", "limit_rates_pkey", "i"),
        ("postbox", "outbox_flow_wait", "i"),
        ("postbox", "require_current_attempt", "function"),
        ("postbox", "begin_processed", "function"),
        ("postbox", "record_success", "function"),
    }
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0005_downgrades_to_0004_dropping_only_its_function(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0004_unique_jobs")
    assert everything - objects(
        empty_database_url
    ) == SESSION_OBJECTS | WORKFLOW_OBJECTS | FAIR_OBJECTS | PLAN_OBJECTS | WAITER_OBJECTS | PRIORITY_OBJECTS | {
        ("postbox", "require_current_attempt", "function"),
        ("postbox", "begin_processed", "function"),  # 0006's, which calls it
        ("postbox", "record_success", "function"),
    }
    assert objects(empty_database_url) - everything == set()
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT postbox.require_current_attempt(1, 7, 2)").fetchone() == (1,)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT postbox.require_current_attempt(0, 7, 2)")
    assert refused.value.sqlstate == "PB001"
    assert "job 7 attempt 2 is no longer current" in str(refused.value)


def test_0006_downgrades_to_0005_dropping_only_its_functions(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0005_fenced_success")
    assert everything - objects(
        empty_database_url
    ) == SESSION_OBJECTS | WORKFLOW_OBJECTS | FAIR_OBJECTS | PLAN_OBJECTS | WAITER_OBJECTS | PRIORITY_OBJECTS | {
        ("postbox", "begin_processed", "function"),
        ("postbox", "record_success", "function"),
    }
    assert objects(empty_database_url) - everything == set()
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything
    with psycopg.connect(empty_database_url) as conn:
        # The processed row: the id when fresh, NULL when already there.
        assert conn.execute("SELECT postbox.begin_processed(7)").fetchone() == (7,)
        assert conn.execute("SELECT postbox.begin_processed(7)").fetchone() == (None,)
        # No running attempt 2 of job 7: the fence refuses, with 0005's error.
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT postbox.record_success(7, 'w', 2)")
    assert refused.value.sqlstate == "PB001"
    assert "job 7 attempt 2 is no longer current" in str(refused.value)


SUCCESS_AFTER_WORK = """
INSERT INTO postbox.outbox (id, queue, task, state, attempts, claimed_by, started_at) OVERRIDING SYSTEM VALUE
VALUES (7, 'default', 'noop', 'running', 1, 'w', now());
SELECT pg_sleep(0.3);
SELECT postbox.record_success(7, 'w', 1);
"""


def _success_took(url: str) -> tuple[float, float]:
    """Seconds from start to finish of a success recorded 0.3 s into its transaction: (outbox, history)."""
    with psycopg.connect(url) as conn:
        with conn.transaction():
            conn.execute(SUCCESS_AFTER_WORK)
            row = conn.execute(
                "SELECT extract(epoch FROM o.finished_at - o.started_at)::float8,"
                " extract(epoch FROM a.finished_at - a.started_at)::float8"
                " FROM postbox.outbox o JOIN postbox.job_attempts a ON a.outbox_id = o.id WHERE o.id = 7"
            ).fetchone()
            conn.execute("DELETE FROM postbox.job_attempts; DELETE FROM postbox.outbox")
    assert row is not None
    return row[0], row[1]


def test_0007_stamps_a_success_when_it_is_written_and_downgrades_to_0006s_stamp(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0007_commit_time")
    everything = objects(empty_database_url)
    took = _success_took(empty_database_url)
    assert all(0.3 <= t < 5 for t in took), took
    migrate.downgrade(empty_database_url, "0006_job_transaction")
    assert objects(empty_database_url) == everything, "0007 replaces a function: no object comes or goes"
    assert _success_took(empty_database_url) == (0.0, 0.0)  # 0006: the transaction's start, now()
    migrate.upgrade(empty_database_url, "0007_commit_time")
    assert objects(empty_database_url) == everything
    took = _success_took(empty_database_url)
    assert all(0.3 <= t < 5 for t in took), took
    with psycopg.connect(empty_database_url) as conn:
        assert migrate.current_revision(conn) == "0007_commit_time"
        # Still fenced: no running attempt 2 of job 7.
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT postbox.record_success(7, 'w', 2)")
    assert refused.value.sqlstate == "PB001"


def test_0008_downgrades_to_0007_dropping_only_the_sessions_table(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0008_sessions")
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0007_commit_time")
    assert everything - objects(empty_database_url) == SESSION_OBJECTS
    assert objects(empty_database_url) - everything == set()
    migrate.upgrade(empty_database_url, "0008_sessions")
    assert objects(empty_database_url) == everything


def test_0009_downgrades_to_0008_dropping_only_the_workflow_objects(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(
            "INSERT INTO postbox.outbox (queue, task, state, workflow_id, waiting_on)"
            " VALUES ('q', 't', 'waiting', 1, 1)"
        )
    migrate.downgrade(empty_database_url, "0008_sessions")
    assert everything - objects(empty_database_url) == (
        WORKFLOW_OBJECTS | FAIR_OBJECTS | PLAN_OBJECTS | WAITER_OBJECTS | PRIORITY_OBJECTS
    )
    assert objects(empty_database_url) - everything == set()
    with psycopg.connect(empty_database_url) as conn:
        # a waiting job has no meaning without workflows: cancelled, saying why
        assert conn.execute("SELECT state, last_error_class FROM postbox.outbox").fetchall() == [
            ("cancelled", "WorkflowsRemoved")
        ]
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0010_downgrades_to_0009_dropping_the_progress_column_and_the_debounce(empty_database_url: str) -> None:
    """0010 adds outbox.progress and replaces unique_claim() and enqueue() (debounce); no object comes or goes."""

    def state(url: str) -> tuple[bool, bool, bool]:
        with psycopg.connect(url) as conn:
            column = conn.execute(
                "SELECT count(*) FROM information_schema.columns"
                " WHERE table_schema = 'postbox' AND table_name = 'outbox' AND column_name = 'progress'"
            ).fetchone()
            sources = dict(
                conn.execute("SELECT proname, prosrc FROM pg_proc WHERE proname IN ('unique_claim', 'enqueue')")
            )
        return column == (1,), "debounce" in sources["unique_claim"], "debounce" in sources["enqueue"]

    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    assert state(empty_database_url) == (True, True, True)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("INSERT INTO postbox.outbox (queue, task, progress) VALUES ('q', 't', '{\"done\": 1}')")
    migrate.downgrade(empty_database_url, "0009_workflows")
    assert state(empty_database_url) == (False, False, False)
    assert (
        objects(empty_database_url)
        == everything - FAIR_OBJECTS - WORKFLOW_EVENT_OBJECTS - PLAN_OBJECTS - WAITER_OBJECTS - PRIORITY_OBJECTS
    )  # 0011-0014's go too
    with psycopg.connect(empty_database_url) as conn:  # 0004's functions again: a plain unique rule still works
        conn.execute(
            "INSERT INTO postbox.tasks (name, queue, priority, max_attempts, keep_result, unique_rule)"
            " VALUES ('u', 'default', 5, 5, false, '{\"period\": 60}')"
        )
        ids = [conn.execute("SELECT postbox.enqueue('u', '{\"a\": 1}')").fetchone() for _ in range(2)]
    assert ids[0] == ids[1]
    migrate.upgrade(empty_database_url)
    assert state(empty_database_url) == (True, True, True)
    assert objects(empty_database_url) == everything


def test_up_down_up_inside_the_schema_only(empty_database_url: str) -> None:
    before = objects(empty_database_url)
    migrate.upgrade(empty_database_url)
    created = objects(empty_database_url) - before
    assert {s for s, _, _ in created} == {"postbox"}, "nothing outside the postbox schema"
    assert tables(empty_database_url) == EXPECTED_TABLES
    assert tables(empty_database_url, "public") == set()
    assert {(name, kind) for _, name, kind in created if kind in ("function", "domain")} == {
        ("enqueue", "function"),
        ("notify_outbox", "function"),
        ("unique_claim", "function"),
        ("require_current_attempt", "function"),
        ("begin_processed", "function"),
        ("record_success", "function"),
        ("workflow_job_ended", "function"),
        ("workflow_release", "function"),
        ("workflow_job_left_waiting", "function"),
        ("claim_attempts", "function"),
        ("record_outcomes", "function"),
        ("mark_published", "function"),
        ("notify_results", "function"),
        ("queue_name", "domain"),
        ("task_name", "domain"),
        ("json_object", "domain"),
    }
    migrate.downgrade(empty_database_url, "base")
    assert tables(empty_database_url) == {"alembic_version"}
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) - before == created
    with psycopg.connect(empty_database_url) as conn:
        assert migrate.current_revision(conn) == migrate.head_revision()
        states = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'outbox_state_check'"
        ).fetchone()[0]  # type: ignore[index]
    for state in ("pending", "queued", "running", "retrying", "succeeded", "dead", "cancelled", "expired", "waiting"):
        assert f"'{state}'" in states


def test_the_outbox_indexes_include_the_unfinished_rows_by_state(database_url: str) -> None:
    """Queue counts (GET /api/v1/queues) read the unfinished and dead rows through a partial index."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'postbox' AND tablename = 'outbox'"
        ).fetchall()
    indexes = dict(rows)
    assert set(indexes) == {
        "outbox_pkey",
        "outbox_unpublished_id",
        "outbox_unpublished_priority",
        "outbox_unpublished_due",
        "outbox_inflight",
        "outbox_dedup",
        "outbox_queue_state",
        "outbox_live_state",
        "outbox_finished",
        "outbox_result_expiry",
        "outbox_unique_key",
        "outbox_flow_wait",
        "outbox_workflow",
        "outbox_waiting",
        "outbox_fair_waiting",
        "outbox_fair_inflight",
    }
    # fair queues' keyed rows leave the relay's id-ordered list (0011)
    assert indexes["outbox_unpublished_id"].endswith("AND (fair_key IS NULL))")
    # the relay's list since 0021: the same rows, highest priority first
    assert indexes["outbox_unpublished_priority"].startswith(
        "CREATE INDEX outbox_unpublished_priority ON postbox.outbox USING btree (priority DESC, id) WHERE"
    )
    assert (
        indexes["outbox_unpublished_priority"].split(" WHERE ")[1]
        == indexes["outbox_unpublished_id"].split(" WHERE ")[1]
    )
    assert indexes["outbox_live_state"] == (
        "CREATE INDEX outbox_live_state ON postbox.outbox USING btree (state, queue) WHERE (state = ANY "
        "(ARRAY['pending'::text, 'queued'::text, 'running'::text, 'retrying'::text, 'dead'::text]))"
    )


def test_an_application_with_its_own_tables_and_alembic_history_is_left_alone(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
        conn.execute("CREATE TABLE outbox (id int PRIMARY KEY, note text)")  # the application's own "outbox"
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('app_0007')")
        conn.execute("INSERT INTO orders VALUES (1, 42)")
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT version_num FROM public.alembic_version").fetchall() == [("app_0007",)]
        assert conn.execute("SELECT version_num FROM postbox.alembic_version").fetchall() == [
            (migrate.head_revision(),)
        ]
        assert migrate.current_revision(conn) == migrate.head_revision()
        with conn.transaction():
            # Unqualified names resolve to the application's tables; postbox's SQL names its schema.
            job = enqueue(conn, tasks_core.noop)
            conn.execute("INSERT INTO orders VALUES (2, 7)")
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
        assert conn.execute("SELECT id FROM postbox.outbox").fetchall() == [(job,)]
    assert tables(empty_database_url, "public") == {"orders", "outbox", "alembic_version"}


def test_enqueue_and_the_sql_function_whatever_the_search_path(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, options="-c search_path=pg_catalog") as conn:
        with conn.transaction():
            first = enqueue(conn, tasks_core.noop)
            second = conn.execute("SELECT postbox.enqueue('noop', '{}'::jsonb, 'other', 7)").fetchone()[0]  # type: ignore[index]
        rows = conn.execute("SELECT id, queue, priority FROM postbox.outbox ORDER BY id").fetchall()
    assert rows == [(first, "default", 5), (second, "other", 7)]


BAD_ROWS = [
    ("Bad Queue", "noop", "{}", "{}"),  # queue name
    ("default", "", "{}", "{}"),  # task name
    ("default", "noop", "[]", "{}"),  # args
    ("default", "noop", "{}", "1"),  # headers
]
INSERT_ROW = "INSERT INTO postbox.outbox (queue, task, args, headers) VALUES (%s, %s, %s::jsonb, %s::jsonb)"


def test_write_once_columns_are_checked_as_domains(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    names = []
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        for row in BAD_ROWS:
            with pytest.raises(psycopg.errors.CheckViolation) as caught:
                conn.execute(INSERT_ROW, row)
            names.append(caught.value.diag.constraint_name or "")
        conn.execute(INSERT_ROW, ("default", "noop", "{}", "{}"))
        conn.execute("UPDATE postbox.outbox SET state = 'queued' WHERE task = 'noop'")
        cur = conn.execute("SELECT queue, task, args, headers FROM postbox.outbox LIMIT 0")
        # Clients see the base types: args and headers still load as JSON.
        assert [d.type_code for d in cur.description or []] == [25, 25, 3802, 3802]
    assert names == ["queue_name_check", "task_name_check", "json_object_check", "json_object_check"]


def test_another_schema_by_setting(empty_database_url: str, other_schema: str) -> None:
    migrate.upgrade(empty_database_url)
    assert tables(empty_database_url, other_schema) == EXPECTED_TABLES
    assert tables(empty_database_url, "postbox") == set()
    with psycopg.connect(empty_database_url) as conn:
        with conn.transaction():
            job = enqueue(conn, tasks_core.noop)
        assert conn.execute("SELECT id FROM shop_jobs.outbox").fetchall() == [(job,)]
        assert migrate.current_revision(conn) == migrate.head_revision()
    migrate.downgrade(empty_database_url, "base")
    assert tables(empty_database_url, other_schema) == {"alembic_version"}


def test_migrate_sql_prints_the_ddl_and_changes_nothing(empty_database_url: str) -> None:
    before = objects(empty_database_url)
    env = {"POSTBOX_DATABASE_URL": empty_database_url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "postbox.app", "migrate", "--sql"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert 'CREATE TABLE "postbox".outbox' in done.stdout
    assert "CREATE TABLE postbox.alembic_version" in done.stdout
    assert "INSERT INTO postbox.alembic_version" in done.stdout
    assert objects(empty_database_url) == before
    bad = subprocess.run(
        [sys.executable, "-m", "postbox.app", "migrate"],
        env={**env, "POSTBOX_SCHEMA": "Bad-Name"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "POSTBOX_SCHEMA" in bad.stderr
    assert objects(empty_database_url) == before


# The definition of everything in a schema, from the catalogs: what two ways of
# migrating must agree on.
SCHEMA_DEFINITION = {
    "columns": """
        SELECT table_name, column_name, data_type, domain_name, is_nullable, column_default, is_identity
          FROM information_schema.columns WHERE table_schema = %(s)s""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s",
    "constraints": """
        SELECT c.conrelid::regclass::text, t.typname, c.conname, pg_get_constraintdef(c.oid)
          FROM pg_constraint c LEFT JOIN pg_type t ON t.oid = c.contypid
         WHERE c.connamespace = %(s)s::regnamespace""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
          FROM pg_proc p WHERE p.pronamespace = %(s)s::regnamespace""",
    "domains": """
        SELECT typname, format_type(typbasetype, typtypmod), typnotnull FROM pg_type
         WHERE typnamespace = %(s)s::regnamespace AND typtype = 'd'""",
    "sequences": "SELECT sequencename, data_type::text FROM pg_sequences WHERE schemaname = %(s)s",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
         WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = %(s)s::regnamespace)""",
    "version": "SELECT version_num FROM postbox.alembic_version",
}


def schema_definition(url: str, name: str = "postbox") -> dict[str, set[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            kind: set(conn.execute(query, {"s": name}).fetchall())  # type: ignore[call-overload]
            for kind, query in SCHEMA_DEFINITION.items()
        }


@pytest.fixture
def second_empty_database_url(servers: Servers) -> Iterator[str]:
    name = databases.create(servers.database_url, "e")
    yield databases.with_database(servers.database_url, name)
    databases.drop(servers.database_url, name)


@pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql (postgresql-client)")
def test_migrate_sql_is_applied_by_psql_as_is_and_equals_migrate(
    empty_database_url: str, second_empty_database_url: str
) -> None:
    env = {"POSTBOX_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/offline", "PATH": "/usr/bin:/bin"}
    printed = subprocess.run(
        [sys.executable, "-m", "postbox.app", "migrate", "--sql"], env=env, capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    applied = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", libpq_url(empty_database_url)],
        input=printed.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    migrate.upgrade(second_empty_database_url)
    by_psql, by_migrate = schema_definition(empty_database_url), schema_definition(second_empty_database_url)
    assert by_psql["version"] == {(migrate.head_revision(),)}
    assert all(by_migrate[kind] for kind in ("columns", "indexes", "constraints", "functions", "domains", "sequences"))
    assert by_psql == by_migrate


def test_0003_flow_control_downgrades_to_0002_dropping_only_its_own_objects(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0003_flow_control")
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0002_schedules")
    assert everything - objects(empty_database_url) == {
        ("postbox", "limits", "r"),
        ("postbox", "limits_pkey", "i"),
        ("postbox", "limit_slots", "r"),
        ("postbox", "limit_slots_pkey", "i"),
        ("postbox", "limit_slots_job", "i"),
        ("postbox", "limit_rates", "r"),
        ("postbox", "limit_rates_pkey", "i"),
        ("postbox", "outbox_flow_wait", "i"),
    }
    with psycopg.connect(empty_database_url) as conn:
        columns = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'postbox' AND table_name = 'outbox'"
            ).fetchall()
        }
    assert not columns & {"flow_wait", "flow_reserved_at"}
    migrate.upgrade(empty_database_url, "0003_flow_control")
    assert objects(empty_database_url) == everything


USER_ENV = """
import os

from alembic import context
from sqlalchemy import Column, Integer, MetaData, Table, Text, create_engine

import postbox.migrate

metadata = MetaData()
Table("widgets", metadata, Column("id", Integer, primary_key=True), Column("name", Text, nullable=False))
HOOKS = {}
if os.environ.get("WITH_POSTBOX_HOOKS") == "1":
    HOOKS = {"include_name": postbox.migrate.include_name, "include_object": postbox.migrate.include_object}

engine = create_engine(os.environ["APP_DATABASE_URL"])
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata, include_schemas=True, **HOOKS)
    with context.begin_transaction():
        context.run_migrations()
"""

USER_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "0001_widgets"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "widgets", sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.Text, nullable=False)
    )
"""


def test_an_applications_alembic_check_ignores_postboxs_schema(empty_database_url: str, tmp_path: Any) -> None:
    """A user's alembic project beside postbox's schema: ``alembic check`` passes with the hooks, not without."""
    database_url = empty_database_url
    migrate.upgrade(database_url)
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(USER_ENV)
    (tmp_path / "versions" / "0001_widgets.py").write_text(USER_REVISION)
    (tmp_path / "alembic.ini").write_text("[alembic]\nscript_location = %(here)s\n")
    env = {
        "APP_DATABASE_URL": "postgresql+psycopg://" + database_url.split("://", 1)[1],
        "PATH": "/usr/bin:/bin",
        "WITH_POSTBOX_HOOKS": "1",
    }

    def alembic(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "alembic", "-c", str(tmp_path / "alembic.ini"), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    upgraded = alembic("upgrade", "head")
    assert upgraded.returncode == 0, upgraded.stderr
    assert tables(database_url, "public") == {"widgets", "alembic_version"}
    assert "outbox" in tables(database_url)  # postbox's schema is there beside it
    checked = alembic("check")
    assert checked.returncode == 0, checked.stderr
    assert "No new upgrade operations detected" in checked.stdout
    without = alembic("check", WITH_POSTBOX_HOOKS="0")
    assert without.returncode != 0
    assert "remove_table" in without.stderr + without.stdout and "outbox" in without.stderr + without.stdout


def test_0011_downgrades_to_0010_returning_keyed_jobs_to_the_relays_list(empty_database_url: str) -> None:
    """0011 adds fair_queues, outbox.fair_key and two indexes; down, a keyed waiting job is a plain one again."""

    def unpublished_index(url: str) -> str:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'outbox_unpublished_id'").fetchone()
        assert row is not None
        return str(row[0])

    migrate.upgrade(empty_database_url, "0011_fair_queues")
    everything = objects(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("INSERT INTO postbox.fair_queues (queue, key_arg) VALUES ('q', 'tenant_id')")
        conn.execute("INSERT INTO postbox.outbox (queue, task, fair_key) VALUES ('q', 't', 'a')")
    assert "fair_key IS NULL" in unpublished_index(empty_database_url)
    migrate.downgrade(empty_database_url, "0010_job_control")
    assert everything - objects(empty_database_url) == FAIR_OBJECTS
    assert "fair_key" not in unpublished_index(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM postbox.outbox WHERE published_at IS NULL AND state = 'pending'"
        ).fetchone() == (1,)
    migrate.upgrade(empty_database_url, "0011_fair_queues")
    assert objects(empty_database_url) == everything


def test_0012_downgrades_to_0011_dropping_the_workflow_events_trigger_and_ended_at(empty_database_url: str) -> None:
    def state(url: str) -> tuple[int, int]:
        with psycopg.connect(url) as conn:
            column = conn.execute(
                "SELECT count(*) FROM information_schema.columns"
                " WHERE table_schema = 'postbox' AND table_name = 'workflows' AND column_name = 'ended_at'"
            ).fetchone()
            trigger = conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_workflow_left_waiting'"
            ).fetchone()
        assert column is not None and trigger is not None
        return int(column[0]), int(trigger[0])

    migrate.upgrade(empty_database_url, "0011_fair_queues")
    with psycopg.connect(empty_database_url) as conn:  # a workflow that ended before 0012, one that has not
        conn.execute("INSERT INTO postbox.workflows (name, jobs) VALUES ('old', 1), ('open', 1)")
        conn.execute(
            "INSERT INTO postbox.outbox (queue, task, state, workflow_id) VALUES ('q', 't', 'succeeded', 1),"
            " ('q', 't', 'pending', 2)"
        )
    before = objects(empty_database_url)
    migrate.upgrade(empty_database_url)
    assert state(empty_database_url) == (1, 1)
    assert objects(empty_database_url) - before == (
        WORKFLOW_EVENT_OBJECTS | PLAN_OBJECTS | WAITER_OBJECTS | PRIORITY_OBJECTS
    )
    with psycopg.connect(empty_database_url) as conn:  # the ended one is not announced by the first relay
        ended = conn.execute("SELECT name, ended_at IS NOT NULL FROM postbox.workflows ORDER BY id").fetchall()
    assert ended == [("old", True), ("open", False)]
    migrate.downgrade(empty_database_url, "0011_fair_queues")
    assert state(empty_database_url) == (0, 0)
    assert objects(empty_database_url) == before


def test_0013_downgrades_to_0012_dropping_only_its_functions(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        settings = conn.execute(
            "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = 'postbox'::regnamespace"
            " AND proname IN ('claim_attempts', 'mark_published', 'record_outcomes') ORDER BY proname"
        ).fetchall()
    assert settings == [
        (name, ["plan_cache_mode=force_generic_plan", "random_page_cost=1.1"])  # the second since 0017
        for name in ("claim_attempts", "mark_published", "record_outcomes")
    ]
    migrate.downgrade(empty_database_url, "0012_workflow_events")
    assert everything - objects(empty_database_url) == PLAN_OBJECTS | WAITER_OBJECTS | PRIORITY_OBJECTS
    assert objects(empty_database_url) - everything == set()
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0014_downgrades_to_0013_dropping_only_the_waiters_and_notifying_every_ended_job(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0013_generic_plans")
    assert everything - objects(empty_database_url) == WAITER_OBJECTS | PRIORITY_OBJECTS
    assert objects(empty_database_url) - everything == set()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:  # 0013's outcome: every end is heard
        [job] = conn.execute(
            "INSERT INTO postbox.outbox (queue, task, state, attempts, claimed_by) VALUES ('q', 't', 'running', 1, 'w')"
            " RETURNING id"
        ).fetchone() or (None,)
        conn.execute("LISTEN postbox_results")
        conn.execute(
            "SELECT postbox.record_outcomes('w', %s::int8[], '{1}', '{succeeded}', '{succeeded}', NULL, NULL, NULL,"
            " NULL, NULL, NULL, true, NULL)",
            ([job],),
        )
        assert [n.payload for n in conn.notifies(timeout=5, stop_after=1)] == [str(job)]
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0015_marks_only_the_attempt_it_sent_and_downgrades_to_0014s_mark(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    mark = "SELECT marked FROM postbox.mark_published(%s::int8[], '{1-1,1-2}', NULL, %s::int4[])"
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(
            "INSERT INTO postbox.outbox (queue, task, attempts) VALUES ('q', 't', 0), ('q', 't', 1) RETURNING id"
        ).fetchall()]  # fmt: skip
        assert conn.execute(mark, (ids, [0, 0])).fetchone() == (1,)  # the second moved on to attempt 1
        states = conn.execute("SELECT state FROM postbox.outbox ORDER BY id").fetchall()
    assert states == [("queued",), ("pending",)]
    migrate.downgrade(empty_database_url, "0014_result_waiters")
    # the same function, by name, with 0013's arguments
    assert objects(empty_database_url) == everything - PRIORITY_OBJECTS
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        marked = conn.execute("SELECT marked FROM postbox.mark_published(%s::int8[], '{1-2}', NULL)", (ids[1:],))
        assert marked.fetchone() == (1,)
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0016_downgrades_to_0015s_success_that_announces_nothing(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    migrate.downgrade(empty_database_url, "0015_mark_attempts")
    assert objects(empty_database_url) == everything - PRIORITY_OBJECTS  # the same function, 0007's body
    with psycopg.connect(empty_database_url) as conn:
        body = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'record_success'").fetchone()
    assert body is not None and "pg_notify" not in body[0]
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        body = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'record_success'").fetchone()
    assert body is not None and "pg_notify" in body[0]


def test_0017_sets_the_key_lookups_inside_the_functions_only_and_downgrades_to_0016(empty_database_url: str) -> None:
    settings = (
        "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = 'postbox'::regnamespace"
        " AND proname IN ('claim_attempts', 'mark_published', 'notify_results', 'record_outcomes') ORDER BY proname"
    )
    names = ("claim_attempts", "mark_published", "notify_results", "record_outcomes")
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute(settings).fetchall() == [
            (name, ["plan_cache_mode=force_generic_plan", "random_page_cost=1.1"]) for name in names
        ]
    success = "SELECT proconfig, prosrc LIKE '%%) IS TRUE%%' FROM pg_proc WHERE proname = 'record_success'"
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute(success).fetchone() == (["random_page_cost=1.1"], True)
    migrate.downgrade(empty_database_url, "0016_success_notice")
    assert objects(empty_database_url) == everything - PRIORITY_OBJECTS
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute(settings).fetchall() == [(name, ["plan_cache_mode=force_generic_plan"]) for name in names]
        assert conn.execute(success).fetchone() == (None, False)  # 0016's function, as it was
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0019_marks_only_due_rows_and_downgrades_to_0018s_mark(empty_database_url: str) -> None:
    settings = "SELECT proconfig FROM pg_proc WHERE proname = 'mark_published'"
    mark = "SELECT marked FROM postbox.mark_published(%s::int8[], '{1-1,1-2}', NULL, '{0,0}')"
    insert = (
        "INSERT INTO postbox.outbox (queue, task, available_at) VALUES ('q', 't', now()), ('q', 't', now() + interval"
        " '1 hour') RETURNING id"
    )
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(insert).fetchall()]
        assert conn.execute(mark, (ids,)).fetchone() == (1,)  # the second was moved to a later time
        assert conn.execute("SELECT state FROM postbox.outbox ORDER BY id").fetchall() == [("queued",), ("pending",)]
        assert conn.execute(settings).fetchone() == (["plan_cache_mode=force_generic_plan", "random_page_cost=1.1"],)
    migrate.downgrade(empty_database_url, "0018_notify_payload")
    assert objects(empty_database_url) == everything - PRIORITY_OBJECTS
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert conn.execute(settings).fetchone() == (["plan_cache_mode=force_generic_plan", "random_page_cost=1.1"],)
        conn.execute("DELETE FROM postbox.outbox")
        ids = [r[0] for r in conn.execute(insert).fetchall()]
        assert conn.execute(mark, (ids,)).fetchone() == (2,)  # 0018's mark: due or not
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0020_keeps_the_outcomes_settings_and_downgrades_to_0019s_notice(empty_database_url: str) -> None:
    """0020 replaces record_outcomes() (its notice looked for only where one can be owed); both ways the
    function keeps 0017's settings, and 0019's version still looks on every call."""
    settings = "SELECT proconfig FROM pg_proc WHERE proname = 'record_outcomes'"
    running = (
        "INSERT INTO postbox.outbox (queue, task, state, attempts, claimed_by, started_at)"
        " VALUES ('q', 't', 'running', 1, 'w', now()) RETURNING id"
    )
    outcome = (
        "SELECT id, notified FROM postbox.record_outcomes('w', %s::int8[], '{1}', '{succeeded}', '{succeeded}',"
        " NULL, NULL, NULL, NULL, NULL, NULL, true, NULL)"
    )
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    for revision_after in (None, "0019_mark_due"):
        if revision_after is not None:
            migrate.downgrade(empty_database_url, revision_after)
            assert objects(empty_database_url) == everything - PRIORITY_OBJECTS
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            configured = ["plan_cache_mode=force_generic_plan", "random_page_cost=1.1"]
            assert conn.execute(settings).fetchone() == (configured,)
            [[job]] = conn.execute(running).fetchall()
            conn.execute(
                "INSERT INTO postbox.result_waiters (job_id, until) VALUES (%s, now() + interval '1 minute')", (job,)
            )
            assert conn.execute(outcome, ([job],)).fetchall() == [(job, 1)]  # a waiter: announced
            [[plain]] = conn.execute(running).fetchall()
            assert conn.execute(outcome, ([plain],)).fetchall() == [(plain, 0)]  # no waiter of its own: not
            conn.execute("DELETE FROM postbox.result_waiters")
            [[alone]] = conn.execute(running).fetchall()
            assert conn.execute(outcome, ([alone],)).fetchall() == [(alone, 0)]  # no waiter anywhere
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything


def test_0021_lists_due_rows_by_priority_through_its_index_and_downgrades_to_0020(empty_database_url: str) -> None:
    """0021 adds the relay's list of due rows, highest priority first; the select of a backlog walks it
    (no sort of the backlog per batch), and 0020 is 0021 without it."""
    migrate.upgrade(empty_database_url)
    everything = objects(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO postbox.outbox (queue, task, priority)"
            " SELECT 'q', 't', g % 10 FROM generate_series(1, 20000) g"
        )
        conn.execute("ANALYZE postbox.outbox")
        params = {"after_priority": 10, "after_id": 0, "limit": 1000, "held": "{}"}
        plan = conn.execute("EXPLAIN " + sql.active().JOB_GET_DUE_UNPUBLISHED, params).fetchall()
        text = "\n".join(line for (line,) in plan)
        assert "Index Cond: (priority < " in text and "Seq Scan" not in text, text  # no sort of the backlog
        rows = conn.execute(sql.active().JOB_GET_DUE_UNPUBLISHED, params).fetchall()
        order = "SELECT priority, id FROM postbox.outbox ORDER BY priority DESC, id"
        listed = conn.execute(order).fetchall()
        assert [(r[5], r[0]) for r in rows] == listed[:1000]
        # from a cursor inside priority 9: the rest of it, then priority 8
        params.update(after_priority=9, after_id=listed[1500][1])
        rows = conn.execute(sql.active().JOB_GET_DUE_UNPUBLISHED, params).fetchall()
        assert [(r[5], r[0]) for r in rows] == listed[1501:2501]
    migrate.downgrade(empty_database_url, "0020_outcome_notice")
    assert everything - objects(empty_database_url) == PRIORITY_OBJECTS
    assert objects(empty_database_url) - everything == set()
    migrate.upgrade(empty_database_url)
    assert objects(empty_database_url) == everything
