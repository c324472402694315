"""The claim, the outcome and the relay's mark find their rows by primary key, whatever the statistics say.

A prepared statement settles on a generic plan. If the state condition of the claim or
the outcome could be served by ``outbox_live_state`` (the mark's by the unpublished
index), that plan reads the index (every live entry, and every entry updates left until
autovacuum) and filters by id: milliseconds per one-row claim on an outbox of finished
rows, tens of milliseconds per mark over a backlog (docs/benchmarks.md).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from postbox import sql

# Each statement's parameters as SQL literals, for EXECUTE.
ARGS = {
    "JOB_CLAIM_ATTEMPTS": {"ids": "'{1,2}'", "entries": "'{1-1,1-2}'", "worker": "'w'", "lease": "30"},
    "JOB_MARK_PUBLISHED": {"ids": "'{1,2}'", "sids": "'{1-1,1-2}'", "term": "1"},
    "JOB_RECORD_OUTCOMES": {
        "worker": "'w'",
        "ids": "'{1,2}'",
        "attempts": "'{1,1}'",
        "states": "'{succeeded,succeeded}'",
        "outcomes": "'{succeeded,succeeded}'",
        "notify": "true",
    },
}


def generic_plan(conn: psycopg.Connection[Any], name: str) -> str:
    """EXPLAIN of ``name``'s generic plan, as a prepared claim or outcome ends up running it."""
    statement = getattr(sql.active(), name)
    params = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${params.index(m.group(1)) + 1}", statement)
    conn.execute(f"PREPARE probe AS {text}")  # parameter types from the statement's own casts
    args = ", ".join(ARGS[name].get(param, "NULL") for param in params)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    return "\n".join(row[0] for row in conn.execute(f"EXPLAIN EXECUTE probe({args})"))


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
            if any(re.search(r"\bid = ANY \(\$", detail) for detail in details):
                found.append((line.strip(), details))
    return found


@pytest.mark.parametrize("name", sorted(ARGS))
def test_the_generic_plan_reads_the_outbox_by_primary_key(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("INSERT INTO postbox.outbox (queue, task) SELECT 'default', 'noop' FROM generate_series(1, 3000)")
    conn.execute("UPDATE postbox.outbox SET state = 'succeeded', published_at = now(), finished_at = now()")
    conn.execute("ANALYZE postbox.outbox")  # none live, as in a quiet shop: the indexes look free
    plan = generic_plan(conn, name)
    scans = scans_by_id(plan)
    assert scans, plan
    for scan, details in scans:
        assert "using outbox_pkey" in scan, plan
        assert any(d.startswith("Index Cond:") and re.search(r"\bid = ANY \(\$", d) for d in details), plan
    assert "outbox_live_state" not in plan
    conn.rollback()
