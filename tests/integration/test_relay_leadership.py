"""Leadership in-process: one leader, a session lost between XADD and mark, stop, events, metrics."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import psycopg
import redis.asyncio as aioredis

from postbox.relay import Relay, RelaySignals
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.redis_server import free_port
from tests.harness.relay import enqueue_sql, entries, leader_pid, running_relay, states
from tests.harness.wait import next_item, wait_event, wait_until_async


async def test_of_two_relays_one_leads_and_the_other_stands_by(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    async with running_relay(settings, relay_id="relay-a") as (a, a_signals):
        await wait_event(a_signals.leader, 10)
        async with running_relay(settings, relay_id="relay-b") as (b, b_signals):
            await wait_event(b_signals.standby, 10)
            ids = enqueue_sql(conn, 5)
            await wait_until_async(lambda: a.published_total == 5, 5, message="the leader publishes")
            assert (a.role, b.role) == ("leader", "standby")
            assert b.published_total == 0
            assert b_signals.leader is not None and not b_signals.leader.is_set()
            conn.commit()
            assert dict(conn.execute("SELECT id, role FROM postbox.relays").fetchall()) == {
                "relay-a": "leader",
                "relay-b": "standby",
            }
            conn.commit()
            a.stop()  # a clean stop hands over at b's next lock retry
            await wait_event(b_signals.leader, 5)
            more = enqueue_sql(conn, 2)
            await wait_until_async(lambda: b.published_total == 2, 5, message="the new leader publishes")
    assert states(conn) == {i: ("queued", 1) for i in ids + more}
    conn.commit()
    assert dict(conn.execute("SELECT id, role FROM postbox.relays").fetchall()) == {
        "relay-a": "stopped",
        "relay-b": "stopped",
    }


async def test_a_leader_whose_session_dies_between_xadd_and_mark_marks_nothing(
    settings: Settings, conn: psycopg.Connection[Any], database_url: str, redis: aioredis.Redis
) -> None:
    """The mark runs on the lock session: once it is gone the old leader cannot mark; the new one publishes."""
    killed: list[int] = []

    async def terminate_own_session(ids: list[int]) -> None:
        if killed:
            return
        assert a.session is not None
        pid = a.session.backend_pid
        killed.append(pid)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

            async def gone() -> bool:
                cur = await admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
                row = await cur.fetchone()
                return row is not None and row[0] == 0

            await wait_until_async(gone, 5, message="the backend to exit")

    a_signals = RelaySignals.all()
    a_signals.before_mark = terminate_own_session
    a = Relay(settings, signals=a_signals, relay_id="relay-a")
    a_task = asyncio.create_task(a.run())
    try:
        await wait_event(a_signals.leader, 10)
        async with running_relay(settings, relay_id="relay-b") as (b, b_signals):
            await wait_event(b_signals.standby, 10)
            ids = enqueue_sql(conn, 3)
            await wait_event(a_signals.lost_leadership, 5)
            await wait_event(b_signals.leader, 5)
            await wait_until_async(lambda: b.published_total == 3, 5, message="the new leader publishes the rows")
            assert a.published_total == 0 and a_signals.published is not None and a_signals.published.empty()
            assert leader_pid(conn, settings.relay_lock_key) == (b.session.backend_pid if b.session else None)
            await wait_until_async(lambda: a.role == "standby", 5, message="the old leader stands by")
    finally:
        a.stop()
        await asyncio.wait_for(a_task, 10)
    # marked once (by the new leader); in the stream twice, both entries with the same outbox id
    assert states(conn) == {i: ("queued", 1) for i in ids}
    assert Counter(int(e["id"]) for e in await entries(redis, settings.redis_prefix)) == Counter({i: 2 for i in ids})


async def test_stop_finishes_releases_the_lock_and_records_stopped(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    async with running_relay(settings, relay_id="relay-a") as (relay, signals):
        await wait_event(signals.leader, 10)
        assert leader_pid(conn, settings.relay_lock_key) is not None
        relay.stop()
        await wait_event(signals.stopped, 2)
    assert leader_pid(conn, settings.relay_lock_key) is None
    conn.commit()
    assert conn.execute("SELECT role FROM postbox.relays WHERE id = 'relay-a'").fetchone() == ("stopped",)


async def test_published_events_go_out_while_someone_listens(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    pubsub = redis.pubsub()
    await pubsub.subscribe(events_channel(settings.redis_prefix))
    try:
        async with running_relay(settings) as (_relay, signals):
            ids = enqueue_sql(conn, 3, queue="mail")
            got: list[int] = []
            while len(got) < 3:
                assert signals.published is not None
                got += await next_item(signals.published, 5)
            found: list[dict[str, Any]] = []
            async with asyncio.timeout(5):
                while len(found) < 3:
                    # None when it read the subscribe confirmation (or nothing in time): read on
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message is not None:
                        found.append(orjson.loads(message["data"]))
    finally:
        await pubsub.aclose()
    assert [(e["type"], e["job_id"], e["queue"], e["task"], e["attempt"]) for e in found] == [
        ("published", i, "mail", "noop", 1) for i in ids
    ]


async def test_metrics_endpoint_reports_the_relay(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    port = free_port()
    delayed = settings.model_copy(update={"relay_metrics_port": port})
    enqueue_sql(conn, 4)
    async with running_relay(delayed) as (relay, _signals):
        await wait_until_async(lambda: relay.published_total == 4, 5, message="4 published")
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")
    }
    assert values["postbox_relay_published_total"] == 4.0
    assert values["postbox_relay_is_leader"] == 1.0
    assert values["postbox_relay_batch_size_count"] >= 1.0
    assert values["postbox_relay_batch_size_sum"] == 4.0
    assert values["postbox_relay_republished_total"] == 0.0
    assert "postbox_relay_backlog" in values
    assert "postbox_relay_oldest_unpublished_age_seconds" in values


async def test_the_leader_prunes_finished_jobs_past_their_retention(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    old, recent, live = enqueue_sql(conn, 3)
    conn.execute(
        "UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() - interval '8 days' WHERE id = %s", (old,)
    )
    conn.execute(
        "UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() - interval '1 day' WHERE id = %s", (recent,)
    )
    conn.commit()

    def remaining() -> set[int]:
        conn.commit()
        found = {r[0] for r in conn.execute("SELECT id FROM postbox.outbox").fetchall()}
        conn.commit()
        return found

    async with running_relay(settings.model_copy(update={"prune_interval": 0.2})) as (relay, signals):
        await wait_event(signals.leader, 10)
        await wait_until_async(lambda: old not in remaining(), 5, message="the old job pruned")
        await wait_until_async(lambda: relay.published_total == 1, 5, message="the live job published")
    assert remaining() == {recent, live}


async def test_stop_does_not_wait_for_a_database_that_does_not_answer(settings: Settings) -> None:
    """A server that accepts TCP but never speaks: connecting would take connect_timeout (5 s)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        port = mute.getsockname()[1]
        silent = settings.model_copy(update={"database_url": f"postgresql://postgres@127.0.0.1:{port}/postbox"})
        relay = Relay(silent, signals=RelaySignals.all())
        task = asyncio.create_task(relay.run())
        await wait_until_async(lambda: len(asyncio.all_tasks()) > 2, 1)  # connecting
        started = time.monotonic()
        relay.stop()
        await asyncio.wait_for(task, 2)
        assert time.monotonic() - started < 1.0
        assert relay.role == "stopped"


async def test_a_mark_refuses_when_a_newer_term_is_recorded(
    settings: Settings, conn: psycopg.Connection[Any], redis: aioredis.Redis
) -> None:
    """The term is checked in the mark itself: a newer leader on record → nothing marked, the relay steps down."""
    async with running_relay(settings, relay_id="relay-a") as (relay, signals):
        await wait_event(signals.leader, 10)
        assert relay.term == 1 and signals.leader is not None
        conn.execute(
            "INSERT INTO postbox.relays (id, host, pid, role, term) VALUES ('relay-z', 'elsewhere', 1, 'leader', 7)"
        )
        conn.commit()
        signals.leader.clear()
        [job] = enqueue_sql(conn, 1)
        await wait_event(signals.lost_leadership, 5)
        # it stands by on a new session, gets the (free) lock again, and takes the next term
        await wait_event(signals.leader, 5)
        assert relay.term == 8
        await wait_until_async(lambda: relay.published_total == 1, 5, message="published in the new term")
    assert states(conn) == {job: ("queued", 1)}  # marked once, by term 8
    assert [int(e["id"]) for e in await entries(redis, settings.redis_prefix)] == [job, job]


def last_seen_after(conn: psycopg.Connection[Any], relay_id: str, since: Any) -> bool:
    row = conn.execute("SELECT last_seen > %s FROM postbox.relays WHERE id = %s", (since, relay_id)).fetchone()
    conn.commit()
    return bool(row and row[0])


async def test_registry_rows_another_session_holds_do_not_stall_the_leaders_heartbeat(
    settings: Settings, conn: psycopg.Connection[Any], database_url: str
) -> None:
    """The heartbeat records silent relays and workers stopped; rows someone holds wait for a later beat."""
    conn.execute(
        "INSERT INTO postbox.workers (id, host, pid, last_seen)"
        " VALUES ('worker-held', 'h', 1, now() - interval '1 hour')"
    )
    conn.execute(
        "INSERT INTO postbox.relays (id, host, pid, role, last_seen)"
        " VALUES ('relay-held', 'h', 1, 'standby', now() - interval '1 hour')"
    )
    conn.commit()
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM postbox.workers WHERE id = 'worker-held' FOR UPDATE")
        holder.execute("SELECT 1 FROM postbox.relays WHERE id = 'relay-held' FOR UPDATE")
        async with running_relay(settings, relay_id="relay-a", heartbeat_interval=0.1) as (a, signals):
            await wait_event(signals.leader, 10)
            row = conn.execute("SELECT now()").fetchone()
            conn.commit()
            assert row is not None
            await wait_until_async(
                lambda: last_seen_after(conn, "relay-a", row[0]), 10, message="a heartbeat past the held rows"
            )
            ids = enqueue_sql(conn, 3)
            await wait_until_async(lambda: a.published_total == 3, 10, message="the leader publishes")
            holder.rollback()  # released: the next heartbeats record both stopped

            def recorded() -> bool:
                worker = conn.execute("SELECT stopped_at IS NOT NULL FROM postbox.workers WHERE id = 'worker-held'")
                relay = conn.execute("SELECT role FROM postbox.relays WHERE id = 'relay-held'")
                done = worker.fetchone() == (True,) and relay.fetchone() == ("stopped",)
                conn.commit()
                return done

            await wait_until_async(recorded, 10, message="the released rows recorded stopped")
    assert states(conn) == {i: ("queued", 1) for i in ids}


async def test_a_leader_stuck_behind_a_lock_gives_its_lock_up_to_a_standby(
    settings: Settings, conn: psycopg.Connection[Any], database_url: str
) -> None:
    """A statement waiting on a lock keeps the session busy (no idle timeout ends it): its wait is bounded."""
    bounded = settings.model_copy(update={"visibility_timeout": 1.0})  # lock waits: 2 s
    async with running_relay(bounded, relay_id="relay-a", heartbeat_interval=0.2) as (a, a_signals):
        await wait_event(a_signals.leader, 10)
        async with running_relay(bounded, relay_id="relay-b", heartbeat_interval=0.2) as (b, b_signals):
            await wait_event(b_signals.standby, 10)
            with psycopg.connect(database_url) as holder:
                # The leader's own row, held: its next heartbeat waits on it (and a new leader's election
                # and heartbeats would, if they did not skip it).
                holder.execute("SELECT 1 FROM postbox.relays WHERE id = 'relay-a' FOR UPDATE")
                await wait_event(a_signals.lost_leadership, 15)
                await wait_event(b_signals.leader, 15)
                ids = enqueue_sql(conn, 2)
                await wait_until_async(lambda: b.published_total == 2, 10, message="the new leader publishes")
                assert a.role != "leader"
                holder.rollback()
    assert states(conn) == {i: ("queued", 1) for i in ids}
