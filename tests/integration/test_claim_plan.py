"""The worker's claim and outcome find their rows by primary key, whatever the statistics say.

A prepared statement settles on a generic plan. If the state condition of the claim or
the outcome could be served by ``outbox_live_state``, that plan reads the state index
(every live entry, and every entry updates left until autovacuum) and filters by id:
milliseconds per one-row claim on an outbox of finished rows (docs/benchmarks.md).
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


@pytest.mark.parametrize("name", sorted(ARGS))
def test_the_generic_plan_reads_the_outbox_by_primary_key(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("INSERT INTO postbox.outbox (queue, task) SELECT 'default', 'noop' FROM generate_series(1, 3000)")
    conn.execute("UPDATE postbox.outbox SET state = 'succeeded', finished_at = now()")  # none live, as in a quiet shop
    conn.execute("ANALYZE postbox.outbox")
    plan = generic_plan(conn, name)
    outbox_scans = [line.strip() for line in plan.splitlines() if re.search(r"Scan.* on outbox ", line)]
    assert outbox_scans and all("outbox_pkey" in line for line in outbox_scans), plan
    assert "outbox_live_state" not in plan
    conn.rollback()
