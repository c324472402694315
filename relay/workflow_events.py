"""Workflow lifecycle events: what PostgreSQL's triggers did, forwarded after it committed.

Releases and cascade cancels happen inside migration 0009's triggers, in
whichever statement ended an upstream job (a worker's outcome batch, a job's own
transaction, a claim, an expiry, an operator's cancel). Migration 0012's row
trigger NOTIFYs each one on ``postbox_workflow``; PostgreSQL delivers a NOTIFY
when its transaction commits and drops it when it rolls back, so what is
forwarded always committed. The leading relay LISTENs on a connection of its
own and PUBLISHes ``released`` and ``cancelled`` (``cause: "upstream"``) events
on the events channel, once each, since one relay leads.

``workflow_finished`` has no statement of its own (the last job to end is not
known in advance, and counting a workflow's unended jobs would put one hot row
under every job's outcome): the ends of jobs arrive on ``postbox_results`` (the
workers' outcome batches and claims NOTIFY the ids of the jobs they ended) and
the cascade cancels above; at most every ``flush_interval`` their workflows are
checked: one statement locks those that look ended and the next (whose
snapshot sees any retry committed before) marks those whose jobs have all
ended (``workflows.ended_at``); each is announced once. Ends that nobody NOTIFYs (an
operator's cancel, an expiry) and whatever was sent while the listener was
disconnected are found by a sweep of the workflows not marked ended, right
after every (re)LISTEN and then every ``sweep_interval``.

Events are a best-effort view (docs/api.md): an event can be lost while the
listener or Redis is down, never invented.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg import AsyncConnection

from postbox import events, redis_conn, sql
from postbox.db import connect_async
from postbox.relay.metrics import RelayMetrics
from postbox.streams import events_channel

log = logging.getLogger(__name__)

APPLICATION_NAME = "postbox-relay-workflow-events"
WORKFLOW_CHANNEL = "postbox_workflow"
RESULTS_CHANNEL = "postbox_results"
SWEEP_PAGE = 500


@dataclass
class Pending:
    """What the notifications received since the last flush ask for (pure; no I/O)."""

    schema: str
    events: list[dict[str, Any]] = field(default_factory=list)
    job_ids: set[int] = field(default_factory=set)  # jobs that ended: their workflows may have ended
    workflow_ids: set[int] = field(default_factory=set)

    def take(self, channel: str, payload: str, ts: float | None = None) -> None:
        """One notification: an event to forward, or ended jobs to check."""
        if channel == RESULTS_CHANNEL:
            self.job_ids.update(int(x) for x in payload.split(",") if x.strip().isdigit())
            return
        if channel != WORKFLOW_CHANNEL:
            return
        try:
            note = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(note, dict) or note.get("schema") != self.schema:
            return  # another schema's outbox in the same database: its own relay forwards it
        type_ = note.get("type")
        if type_ not in ("released", "cancelled"):
            return
        evt = events.event(
            "released" if type_ == "released" else "cancelled",
            job_id=int(note["job_id"]),
            queue=str(note["queue"]),
            task=str(note["task"]),
            ts=ts,
        )
        evt["workflow_id"] = int(note["workflow_id"])
        if type_ == "cancelled":
            evt["cause"] = "upstream"
            self.workflow_ids.add(int(note["workflow_id"]))  # a cancel can be a workflow's last end
        self.events.append(evt)

    def __bool__(self) -> bool:
        return bool(self.events or self.job_ids or self.workflow_ids)


def finished_event(workflow_id: int, name: str, jobs: int, status: str, ts: float | None = None) -> dict[str, Any]:
    evt = events.event("workflow_finished", job_id=None, queue=None, task=None, ts=ts)
    evt.update(workflow_id=workflow_id, name=name, jobs=jobs, status=status)
    return evt


class WorkflowEvents:
    """LISTENs, forwards and announces (see the module docstring); runs until cancelled."""

    def __init__(
        self,
        url: str,
        redis: redis_conn.AnyRedis,
        prefix: str,
        schema: str,
        *,
        emit_events: bool | None = None,
        flush_interval: float = 0.2,
        sweep_interval: float = 10.0,
        reconnect_delay: float = 0.2,
        on_listening: Callable[[], None] | None = None,
        metrics: RelayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.redis = redis
        self.channel = events_channel(prefix)
        self.schema = schema
        self.emit_events = emit_events
        self.flush_interval = flush_interval
        self.sweep_interval = sweep_interval
        self.reconnect_delay = reconnect_delay
        self.on_listening = on_listening
        self.metrics = metrics
        self.clock = clock
        self.forwarded = 0
        self.announced = 0

    async def run(self) -> None:
        delay = self.reconnect_delay
        while True:
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await connect_async(
                    self.url, autocommit=True, application_name=APPLICATION_NAME, connect_timeout=5
                )
                statements = sql.active()
                await conn.execute(statements.WORKFLOW_LISTEN)
                await conn.execute(statements.RESULTS_LISTEN)
                delay = self.reconnect_delay
                if self.on_listening is not None:
                    self.on_listening()
                await self._listen(conn)
            except psycopg.Error as exc:
                log.warning("workflow events listener disconnected, reconnecting", extra={"error": str(exc).strip()})
            except Exception:  # a view, never a reason to stop: log it and listen again
                log.exception("workflow events listener failed, reconnecting")
            finally:
                if conn is not None:
                    await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _listen(self, conn: AsyncConnection[Any]) -> None:
        next_sweep = self.clock()  # right after every (re)LISTEN: anything sent meanwhile is lost
        while True:
            pending = Pending(self.schema)
            deadline = self.clock() + self.flush_interval
            async with contextlib.aclosing(conn.notifies(timeout=self.flush_interval)) as notes:
                async for note in notes:
                    pending.take(note.channel, note.payload)
                    if self.clock() >= deadline:
                        break
            if pending.events:
                if self.metrics is not None:
                    for evt in pending.events:
                        self.metrics.workflow_jobs.labels(evt["type"]).inc()
                await self._publish(pending.events)
            workflow_ids = set(pending.workflow_ids)
            if pending.job_ids:
                cur = await conn.execute(sql.active().JOB_LIST_WORKFLOW_IDS, {"ids": sorted(pending.job_ids)})
                workflow_ids.update(int(r[0]) for r in await cur.fetchall())
            if workflow_ids:
                await self._announce(conn, workflow_ids)
            if self.clock() >= next_sweep:
                await self.sweep(conn)
                next_sweep = self.clock() + self.sweep_interval

    async def sweep(self, conn: AsyncConnection[Any]) -> None:
        """Check every workflow not marked ended, a page at a time."""
        after = 0
        while True:
            cur = await conn.execute(sql.active().WORKFLOW_LIST_UNENDED, {"after": after, "limit": SWEEP_PAGE})
            ids = [int(r[0]) for r in await cur.fetchall()]
            if not ids:
                return
            await self._announce(conn, ids)
            after = ids[-1]

    async def _announce(self, conn: AsyncConnection[Any], workflow_ids: Iterable[int]) -> None:
        statements = sql.active()
        async with conn.transaction():
            cur = await conn.execute(statements.WORKFLOW_LOCK_ENDED, {"ids": sorted(workflow_ids)})
            locked = [int(r[0]) for r in await cur.fetchall()]
            if not locked:
                return
            # a second statement: its snapshot, taken with the locks held, sees a retry committed before
            cur = await conn.execute(statements.WORKFLOW_MARK_ENDED, {"ids": locked})
            ended = await cur.fetchall()
        if ended:
            self.announced += len(ended)
            if self.metrics is not None:
                for row in ended:
                    self.metrics.workflows_ended.labels(str(row[3])).inc()
            await self._publish([finished_event(int(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in ended])

    async def _wanted(self) -> bool:
        if self.emit_events is not None:
            return self.emit_events
        return await redis_conn.subscribers(self.redis, self.channel) > 0

    async def _publish(self, evts: list[dict[str, Any]]) -> None:
        try:
            if not await self._wanted():
                return
            pipe = self.redis.pipeline(transaction=False)
            for evt in evts:
                pipe.publish(self.channel, events.encode(evt))
            await pipe.execute()
            self.forwarded += len(evts)
        except Exception as exc:  # events are a view, never a dependency
            log.warning("workflow events not published", extra={"error": f"{type(exc).__name__}: {exc}"})
