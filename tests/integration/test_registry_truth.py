"""Issue 14, defect 9: after SIGKILL the relays and workers tables tell the truth within the lease."""

from __future__ import annotations

from typing import Any

import psycopg

from postbox.app.services import workers as worker_service
from postbox.settings import Settings
from tests.harness.relay import running_relay
from tests.harness.wait import wait_event, wait_until_async


def rows(conn: psycopg.Connection[Any], query: str) -> dict[str, Any]:
    found = dict(conn.execute(query).fetchall())
    conn.commit()
    return found


async def test_a_dead_leader_and_dead_workers_are_recorded_stopped(
    settings: Settings, conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    lease = 3.0
    # What SIGKILL leaves behind: a leader row that just beat, a standby and a worker
    # silent for a while, and a live worker (beating) that must stay as it is.
    conn.execute(
        "INSERT INTO postbox.relays (id, host, pid, role, term, last_seen) VALUES"
        " ('relay-killed', 'h', 1, 'leader', 1, now()),"
        " ('relay-silent', 'h', 2, 'standby', 0, now() - interval '1 hour')"
    )
    conn.execute(
        "INSERT INTO postbox.workers (id, host, pid, in_flight, last_seen) VALUES"
        " ('worker-killed', 'h', 3, 4, now() - interval '1 hour'), ('worker-live', 'h', 4, 2, now())"
    )
    conn.commit()
    settings = settings.model_copy(update={"visibility_timeout": lease, "relay_session_timeout": 2.0})
    async with running_relay(settings, relay_id="relay-new", heartbeat_interval=0.2) as (_, signals):
        await wait_event(signals.leader, 10)
        # Holding the lock proves the old leader is not leading: recorded at once.
        assert rows(conn, "SELECT id, role FROM postbox.relays ORDER BY id")["relay-killed"] == "stopped"
        await wait_until_async(
            lambda: rows(conn, "SELECT id, stopped_at IS NOT NULL FROM postbox.workers")["worker-killed"],
            5,
            message="the silent worker recorded stopped",
        )
        assert rows(conn, "SELECT id, role FROM postbox.relays") == {
            "relay-killed": "stopped",
            "relay-silent": "stopped",
            "relay-new": "leader",
        }
        assert rows(conn, "SELECT id, in_flight FROM postbox.workers WHERE stopped_at IS NULL") == {"worker-live": 2}
        listed = {w.id: w for w in await worker_service.list_workers(aconn, heartbeat_interval=5.0)}
        assert (listed["worker-killed"].stopped, listed["worker-killed"].in_flight) == (True, 0)
        assert (listed["worker-live"].stopped, listed["worker-live"].stale) == (False, False)
        # A live worker that goes silent for longer than its lease is recorded stopped too...
        await wait_until_async(
            lambda: rows(conn, "SELECT id, stopped_at IS NOT NULL FROM postbox.workers")["worker-live"],
            lease + 3,
            message="the silent live worker recorded stopped",
        )
        # ... and its own next heartbeat (a frozen worker resumed) says it runs again.
        conn.execute("UPDATE postbox.workers SET stopped_at = NULL, last_seen = now() WHERE id = 'worker-live'")
        conn.commit()
        assert rows(conn, "SELECT id, stopped_at IS NULL FROM postbox.workers")["worker-live"] is True
