"""Workflow lifecycle events on the events channel, forwarded by a running relay from what committed.

Outcomes are plain UPDATEs of the outbox followed by the NOTIFY a worker's
outcome batch sends (``postbox_results`` with the ended ids); the relay runs in
this event loop, Redis and PostgreSQL are real, and the test subscribes to the
events channel as the API's hub does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import redis.asyncio as aioredis

import postbox
from postbox import events
from postbox.app.services import workflows
from postbox.app.services.audit import Actor
from postbox.relay.workflow_events import APPLICATION_NAME, WorkflowEvents
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.api import make_client
from tests.harness.fleet import child
from tests.harness.relay import running_relay
from tests.harness.tasks import workflow as w
from tests.harness.wait import wait_event, wait_until, wait_until_async
from tests.integration.test_workflows_ops import diamond

WORKFLOW_TYPES = ("released", "cancelled", "workflow_finished")


class Feed:
    """Every event the channel carries, in arrival order."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def seen(self) -> list[tuple[Any, ...]]:
        """The workflow events so far: (type, job_id) or (type, workflow_id, status)."""
        out: list[tuple[Any, ...]] = []
        for evt in self.items:
            if evt["type"] == "workflow_finished":
                out.append((evt["type"], evt["workflow_id"], evt["status"]))
            elif evt["type"] in WORKFLOW_TYPES and "workflow_id" in evt:
                out.append((evt["type"], evt["job_id"]))
        return out

    async def until(self, count: int, timeout: float = 30.0) -> list[tuple[Any, ...]]:  # noqa: ASYNC109
        return await wait_until_async(
            lambda: self.seen() if len(self.seen()) >= count else None,
            timeout,
            message=lambda: f"{count} workflow events (so far {self.seen()})",
        )


@contextlib.asynccontextmanager
async def subscribed(settings: Settings) -> AsyncIterator[Feed]:
    client = aioredis.Redis.from_url(str(settings.redis_url))
    pubsub = client.pubsub()
    feed = Feed()
    await pubsub.subscribe(events_channel(settings.redis_prefix))

    async def read() -> None:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None and message["type"] == "message":
                feed.items.append(events.decode(message["data"]))

    reader = asyncio.create_task(read())
    try:
        yield feed
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await pubsub.aclose()
        await client.aclose()


def forwarding(conn: psycopg.Connection[Any]) -> bool:
    """Whether a relay's workflow events connection to this database has LISTENed (its sweep has begun)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s AND query LIKE %s",
        (APPLICATION_NAME, "%ended_at%"),
    ).fetchone()
    conn.commit()
    return row is not None and row[0] > 0


def end(conn: psycopg.Connection[Any], job_id: int, state: str, *, commit: bool = True) -> None:
    """End a job as a worker's outcome batch does: the UPDATE (the trigger releases), then its NOTIFY."""
    conn.execute("UPDATE postbox.outbox SET state = %s, finished_at = now() WHERE id = %s", (state, job_id))
    conn.execute("SELECT pg_notify('postbox_results', %s)", (str(job_id),))
    if commit:
        conn.commit()


def ended_at(conn: psycopg.Connection[Any], workflow_id: int) -> Any:
    row = conn.execute("SELECT ended_at FROM postbox.workflows WHERE id = %s", (workflow_id,)).fetchone()
    conn.commit()
    assert row is not None
    return row[0]


async def test_releases_cascades_and_the_end_are_announced_once_and_never_for_a_rollback(
    settings: Settings, conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    ids = diamond(conn)
    a, b, c, d = ids.jobs
    async with subscribed(settings) as feed, running_relay(settings) as (relay, signals):
        await wait_event(signals.workflow_events_listening, message="the workflow events' LISTEN")
        # a transaction that releases b and c, then rolls back: nothing is announced
        end(conn, a, "succeeded", commit=False)
        pending = "SELECT count(*) FROM postbox.outbox WHERE id IN (%s, %s) AND state = 'pending'"
        assert conn.execute(pending, (b, c)).fetchone() == (2,)
        conn.rollback()
        end(conn, a, "succeeded")
        first = await feed.until(2)
        assert sorted(first) == [("released", b), ("released", c)]
        released = [x for x in feed.items if x["type"] == "released"]
        assert {(x["workflow_id"], x["queue"], x["task"]) for x in released} == {(ids.id, w.QUEUE, "wf_plain")}
        end(conn, b, "dead")  # d is cancelled by its policy; c has not ended: the workflow has not
        assert (await feed.until(3))[2] == ("cancelled", d)
        cancelled = next(x for x in feed.items if x["type"] == "cancelled" and x.get("workflow_id"))
        assert cancelled["cause"] == "upstream"
        end(conn, c, "succeeded")
        assert (await feed.until(4))[3] == ("workflow_finished", ids.id, "failed")
        finished = next(x for x in feed.items if x["type"] == "workflow_finished")
        assert (finished["name"], finished["jobs"], finished["job_id"]) == ("diamond", 4, None)
        assert ended_at(conn, ids.id) is not None

        # a retry opens it again: b released, then d, then it ends again, once
        change = await workflows.retry_workflow(aconn, ids.id, Actor("test"))
        assert change.retried == [b, d]
        assert ended_at(conn, ids.id) is None
        assert (await feed.until(5))[4] == ("released", b)
        end(conn, b, "succeeded")
        assert (await feed.until(6))[5] == ("released", d)
        end(conn, d, "succeeded")
        assert (await feed.until(7))[6] == ("workflow_finished", ids.id, "succeeded")
        sample = relay.metrics.registry.get_sample_value
        assert sample("postbox_relay_workflows_ended_total", {"status": "failed"}) == 1
        assert sample("postbox_relay_workflows_ended_total", {"status": "succeeded"}) == 1
        assert sample("postbox_relay_workflow_jobs_total", {"type": "released"}) == 4  # b, c; b again, d
        assert sample("postbox_relay_workflow_jobs_total", {"type": "cancelled"}) == 1
        # the sweep checks every workflow not ended: this one is not announced again
        assert relay.workflow_events is not None
        async with await psycopg.AsyncConnection.connect(str(settings.database_url), autocommit=True) as sweeper:
            await relay.workflow_events.sweep(sweeper)
        # a marker published after the sweep returned arrives after anything the sweep published
        async with aioredis.Redis.from_url(str(settings.redis_url)) as marker:
            evt = events.event("enqueued", job_id=0, queue="marker", task="marker")
            await marker.publish(events_channel(settings.redis_prefix), events.encode(evt))
        await wait_until_async(lambda: any(x["queue"] == "marker" for x in feed.items), 30, message="the marker")
    assert len(feed.seen()) == 7, feed.seen()


async def test_a_workflow_that_ended_while_no_relay_listened_is_announced_when_one_starts(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    done = postbox.enqueue_workflow(conn, w.wf_plain.s(label="a") | w.wf_plain.s(label="b"), name="quiet")
    running = postbox.enqueue_workflow(conn, w.wf_plain.s(label="c") | w.wf_plain.s(label="d"), name="busy")
    conn.commit()
    # ended without a NOTIFY anyone heard (an operator's cancel sends none either)
    conn.execute("UPDATE postbox.outbox SET state = 'cancelled', finished_at = now() WHERE id = %s", (done.jobs[0],))
    conn.commit()
    async with subscribed(settings) as feed, running_relay(settings) as (_, signals):
        await wait_event(signals.workflow_events_listening, message="the workflow events' LISTEN")
        assert await feed.until(1) == [("workflow_finished", done.id, "cancelled")]
    assert ended_at(conn, running.id) is None


async def test_no_event_is_published_when_events_are_off_but_the_end_is_still_marked(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ids = postbox.enqueue_workflow(conn, w.wf_plain.s(label="a") | w.wf_plain.s(label="b"))
    conn.commit()
    async with subscribed(settings) as feed, running_relay(settings, emit_events=False) as (_, signals):
        await wait_event(signals.workflow_events_listening, message="the workflow events' LISTEN")
        end(conn, ids.jobs[0], "succeeded")
        end(conn, ids.jobs[1], "succeeded")
        await wait_until_async(lambda: ended_at(conn, ids.id), 30, message="the workflow marked ended")
    assert feed.seen() == []


def test_the_websocket_filtered_by_workflow_gets_its_releases_cascades_and_end_from_a_relay_process(
    settings: Settings, child_env: dict[str, str], conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    mine = diamond(conn, "mine")
    other = diamond(conn, "other")
    a, b, c, d = mine.jobs
    with (
        make_client(settings) as client,
        client.websocket_connect(f"/ws/events?workflow_id={mine.id}") as ws,
        child(["-m", "postbox.relay", "run"], child_env, tmp_path / "relay.log"),
    ):
        # the relay's forwarder LISTENs once it leads, then sweeps: what committed before is not announced
        wait_until(lambda: forwarding(conn), 60, message="the relay's workflow events listening")
        end(conn, other.jobs[0], "succeeded")
        end(conn, a, "succeeded")
        first = ws.receive_json()
        assert (first["type"], first["workflow_id"]) == ("released", mine.id)
        second = ws.receive_json()
        assert {first["job_id"], second["job_id"]} == {b, c}
        end(conn, other.jobs[1], "dead")  # the other's cascade: filtered out
        end(conn, b, "dead")
        third = ws.receive_json()
        assert (third["type"], third["job_id"], third["cause"]) == ("cancelled", d, "upstream")
        end(conn, c, "succeeded")
        last = ws.receive_json()
        assert (last["type"], last["workflow_id"], last["status"], last["job_id"]) == (
            "workflow_finished", mine.id, "failed", None
        )  # fmt: skip


async def test_a_workflow_held_by_a_retry_is_not_marked_until_that_transaction_ends(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ids = postbox.enqueue_workflow(conn, w.wf_plain.s(label="a") | w.wf_plain.s(label="b"))
    conn.commit()
    end(conn, ids.jobs[0], "dead")  # b cancelled: every job has ended
    async with (
        aioredis.Redis.from_url(str(settings.redis_url)) as client,
        await psycopg.AsyncConnection.connect(str(settings.database_url), autocommit=True) as aconn,
        await psycopg.AsyncConnection.connect(str(settings.database_url)) as holder,
    ):
        forwarder = WorkflowEvents(
            str(settings.database_url), client, settings.redis_prefix, "postbox", emit_events=True
        )
        await holder.execute("SELECT id FROM postbox.workflows WHERE id = %s FOR UPDATE", (ids.id,))
        await forwarder.sweep(aconn)  # the lock's holder decides first: skipped, not waited for
        assert (forwarder.announced, ended_at(conn, ids.id)) == (0, None)
        await holder.rollback()
        await forwarder.sweep(aconn)
        assert forwarder.announced == 1 and ended_at(conn, ids.id) is not None
        await forwarder.sweep(aconn)
        assert forwarder.announced == 1
