"""The claim, the outcome and the relay's mark find their rows by primary key, whatever the statistics say.

The three run in functions that keep a generic plan per connection (migration 0013). If
the state condition of the claim or the outcome could be served by ``outbox_live_state``
(the mark's by the unpublished index), that plan reads the index (every live entry, and
every entry updates left until autovacuum) and filters by id: milliseconds per one-row
claim on an outbox of finished rows, tens of milliseconds per mark over a backlog
(docs/benchmarks.md). The plans are the ones the functions ran, as ``auto_explain``
reports them (nested statements, sent to the client as notices).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from postbox import sql

# The functions' statements and their parameters, run as a worker runs them.
RUN_ARGS: dict[str, dict[str, Any]] = {
    "JOB_CLAIM_ATTEMPTS": {"ids": "{1,2}", "entries": "{1-1,1-2}", "worker": "w", "lease": 30.0},
    "JOB_MARK_PUBLISHED": {"ids": "{1,2}", "sids": "{1-1,1-2}", "term": None, "attempts": "{0,0}"},
    "JOB_RECORD_OUTCOMES": {
        "worker": "w",
        "ids": "{1,2}",
        "attempts": "{1,1}",
        "states": "{succeeded,succeeded}",
        "outcomes": "{succeeded,succeeded}",
        **dict.fromkeys(["delays", "results", "result_ttls", "error_classes", "errors", "tracebacks"]),
        "notify": True,
        "also_notify": None,
    },
}


def function_plan(conn: psycopg.Connection[Any], name: str) -> str:
    """The plan ``name``'s function ran its statement with, as auto_explain logs it."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting, value in [("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_level", "notice")]:
        conn.execute(f"SET auto_explain.{setting} = {value}")
    conn.execute(getattr(sql.active(), name), RUN_ARGS[name])
    # (record_outcomes()'s second statement, the check for result waiters, is not the one looked at)
    plans = [n for n in notices if re.search(r"Scan.* on outbox ", n) and "result_waiters" not in n]
    assert len(plans) == 1, notices
    return plans[0]


# The statement's ids as an array parameter, or as the rows of unnest(ids, ...) AS s (the mark, migration 0015).
BY_IDS = r"\bid = (ANY \(\$|s\.id\b)"


def scans_by_id(plan: str) -> list[tuple[str, list[str]]]:
    """The plan's scans of the outbox that look rows up by the statement's ids, with their conditions."""
    lines = plan.splitlines()
    found = []
    for i, line in enumerate(lines):
        if re.search(r"Scan.* on outbox ", line):
            details = []
            for following in lines[i + 1 :]:
                if "->" in following:
                    break
                details.append(following.strip())
            if any(re.search(BY_IDS, detail) for detail in details):
                found.append((line.strip(), details))
    return found


@pytest.mark.parametrize("name", sorted(RUN_ARGS))
def test_the_generic_plan_reads_the_outbox_by_primary_key(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("INSERT INTO postbox.outbox (queue, task) SELECT 'default', 'noop' FROM generate_series(1, 3000)")
    conn.execute("UPDATE postbox.outbox SET state = 'succeeded', published_at = now(), finished_at = now()")
    conn.execute("ANALYZE postbox.outbox")  # none live, as in a quiet shop: the indexes look free
    plan = function_plan(conn, name)
    scans = scans_by_id(plan)
    assert scans, plan
    for scan, details in scans:
        assert "using outbox_pkey" in scan, plan
        assert any(d.startswith("Index Cond:") and re.search(BY_IDS, d) for d in details), plan
    assert "outbox_live_state" not in plan
    conn.rollback()


@pytest.mark.parametrize("name", sorted(RUN_ARGS))
def test_a_plan_made_on_a_small_outbox_still_reads_it_by_primary_key(conn: psycopg.Connection[Any], name: str) -> None:
    """A connection's first call plans for the table as it is then: a few rows, never analyzed (a new shop, a
    benchmark's empty outbox). A sequential scan looked cheapest there, and the connection kept it while the table
    grew (migration 0017)."""
    conn.execute("INSERT INTO postbox.outbox (queue, task) SELECT 'default', 'noop' FROM generate_series(1, 3)")
    plan = function_plan(conn, name)
    assert "Seq Scan on outbox" not in plan and "outbox_live_state" not in plan, plan
    scans = scans_by_id(plan)
    assert scans, plan
    for scan, _details in scans:  # the key, looked up alone or through a bitmap of it
        assert "using outbox_pkey" in scan or "Bitmap Heap Scan" in scan, plan
    assert "Bitmap Index Scan on outbox_pkey" in plan or "Bitmap Heap Scan" not in plan, plan
    conn.rollback()


def test_the_fenced_success_reads_its_row_by_primary_key_on_a_small_outbox(conn: psycopg.Connection[Any]) -> None:
    """``record_success()`` (a ``ctx.transaction()`` job's success): its fence's conditions could be served by
    ``outbox_live_state``, every running entry and the dead ones updates left; on a small outbox the planner took it."""
    [(job_id,)] = conn.execute(
        "INSERT INTO postbox.outbox (queue, task, state, attempts, claimed_by) VALUES ('default', 'noop', 'running', 1,"
        " 'w'), ('default', 'noop', 'pending', 0, NULL) RETURNING id"
    ).fetchall()[:1]
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting, value in [("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_level", "notice")]:
        conn.execute(f"SET auto_explain.{setting} = {value}")
    conn.execute("SELECT postbox.record_success(%s, 'w', 1)", (job_id,))
    [plan] = [n for n in notices if re.search(r"Update on outbox", n)]
    assert "Index Scan using outbox_pkey on outbox" in plan and "outbox_live_state" not in plan, plan
    assert conn.execute("SELECT state FROM postbox.outbox WHERE id = %s", (job_id,)).fetchone() == ("succeeded",)
    conn.rollback()


def test_the_claims_settings_last_as_they_should(conn: psycopg.Connection[Any]) -> None:
    """The claim's asynchronous commit lasts to the end of its transaction; the forced plan mode does not."""
    [(job_id,)] = conn.execute("INSERT INTO postbox.outbox (queue, task) VALUES ('default', 'noop') RETURNING id")
    conn.commit()
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    page_cost = conn.execute("SHOW random_page_cost").fetchone()
    claim = {"ids": f"{{{job_id}}}", "entries": "{1-1}", "worker": "w", "lease": 30.0}
    claimed = conn.execute(sql.active().JOB_CLAIM_ATTEMPTS, claim).fetchall()
    assert [(row[0], row[1], row[2]) for row in claimed] == [(job_id, "running", 1)]
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    assert conn.execute("SHOW plan_cache_mode").fetchone() == ("auto",)  # a handler's statements: planned as before
    assert conn.execute("SHOW random_page_cost").fetchone() == page_cost  # the functions' own (0017): inside only
    conn.commit()
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
