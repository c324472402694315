"""Flow control as the worker applies it: limits in force, the limited claim, slot release.

Deliveries of jobs under no limit take the plain claim (``claims.claim``),
untouched. The others are claimed in one transaction that holds their keys'
locks (``sql.FLOW_*``): the jobs a limit allows start (their slots taken,
their rate cells moved); the rest are held back — unclaimed, attempts untouched,
their stream entries acknowledged — and published again when they may run: at
their rate reservation, or when a slot of the key they wait on is released
(:func:`release`, after an outcome), or at the latest after ``recheck`` seconds.
A held-back job never waits in the stream, so it blocks nothing behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from postbox import flow, sql
from postbox.flow import Candidate, FlowLimit, JobKeys, Limits, Park, Reserve, Start, State
from postbox.registry import Registry
from postbox.worker import claims
from postbox.worker.delivery import Delivery, Job

log = logging.getLogger("postbox.worker.flow")


def declared(registry: Registry) -> list[tuple[str, str, FlowLimit]]:
    """What the loaded code declares: (scope, name, limit) for every task and declared queue."""
    out = [("task", name, registry.get(name).limit) for name in registry.names()]
    out += [("queue", queue, limit) for queue, limit in sorted(registry.queue_limits.items())]
    return out


async def publish(conn: AsyncConnection[Any], registry: Registry, *, by: str) -> None:
    rows = declared(registry)
    if not rows:
        return
    await conn.execute(
        sql.active().FLOW_PUBLISH_DECLARED,
        {
            "scopes": [scope for scope, _, _ in rows],
            "names": [name for _, name, _ in rows],
            "declared": [None if lim.empty else orjson.dumps(lim.to_json()).decode() for _, _, lim in rows],
            "by": by,
        },
    )


async def load(conn: AsyncConnection[Any], queues: Sequence[str], tasks: Sequence[str]) -> Limits:
    """The limits in force for these queues and tasks: the published declaration, the override on top."""
    cur = await conn.execute(sql.active().FLOW_SELECT_LIMITS, {"queues": list(queues), "tasks": list(tasks)})
    limits = Limits()
    for scope, name, declared_json, override in await cur.fetchall():
        try:
            limit = flow.effective(FlowLimit.from_json(declared_json), override)
        except Exception:  # a hand-edited row must not stop the worker
            log.exception("ignoring unreadable limits", extra={"queue": name if scope == "queue" else None})
            continue
        if limit.empty:
            continue
        (limits.queues if scope == "queue" else limits.tasks)[name] = limit
    return limits


@dataclass
class FlowClaim:
    batch: claims.ClaimBatch = field(default_factory=claims.ClaimBatch)
    held: list[Delivery] = field(default_factory=list)  # acknowledge: published again when it may run
    unmarked: list[Delivery] = field(default_factory=list)  # publish not marked yet: leave pending


async def claim(
    pool: AsyncConnectionPool[Any],
    deliveries: Sequence[tuple[Delivery, JobKeys]],
    *,
    worker_id: str,
    lease: float,
    recheck: float,
) -> FlowClaim:
    """Claim what the limits allow of these deliveries; hold the rest back (one transaction)."""
    out = FlowClaim()
    if not deliveries:
        return out
    keys_of: dict[int, JobKeys] = {}
    for delivery, keys in deliveries:
        keys_of.setdefault(delivery.job_id, keys)
    conc_keys = sorted({key for keys in keys_of.values() for key, _ in keys.concurrency})
    rate_keys = sorted({key for keys in keys_of.values() for key, _ in keys.rate})
    ids = sorted(keys_of)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(sql.active().FLOW_LOCK_KEYS, {"keys": sorted({*conc_keys, *rate_keys})})
        cur = await conn.execute(sql.active().FLOW_LOCK_JOBS, {"ids": ids})
        claimable = {row[0]: row[1] for row in await cur.fetchall()}
        cur = await conn.execute(sql.active().FLOW_STATE, {"conc_keys": conc_keys, "rate_keys": rate_keys})
        state = State(now=0.0)
        for kind, key, value in await cur.fetchall():
            if kind == "now":
                state.now = value
            elif kind == "used":
                state.used[key] = int(value)
            else:
                state.tat[key] = value
        decisions = flow.allocate(
            [Candidate(job_id, keys_of[job_id], claimable[job_id]) for job_id in ids if job_id in claimable], state
        )
        starting = {d.job_id for d in decisions if isinstance(d, Start)}
        holds = {d.job_id: d for d in decisions if not isinstance(d, Start)}
        # Jobs not claimable now go through the claim too: it tells skip from keep.
        to_claim = [d for d, _ in deliveries if d.job_id in starting or d.job_id not in claimable]
        out.batch = await claims.claim_on(conn, to_claim, worker_id=worker_id, lease=lease)
        slots = [(key, job.id, job.attempt) for job in out.batch.run for key, _ in keys_of[job.id].concurrency]
        for job in out.batch.run:
            job.flow_slots = bool(keys_of[job.id].concurrency)
        if slots or state.changed_tat:
            changed = sorted(state.changed_tat)
            await conn.execute(
                sql.active().FLOW_TAKE,
                {
                    "slot_keys": [k for k, _, _ in slots],
                    "slot_ids": [j for _, j, _ in slots],
                    "slot_attempts": [a for _, _, a in slots],
                    "rate_keys": changed,
                    "tats": [state.tat[k] for k in changed],
                    "claimed": [job.id for job in out.batch.run],
                },
            )
        if holds:
            hold_ids = sorted(holds)
            until: list[float] = []
            waits: list[str | None] = []
            reserved: list[float | None] = []
            for job_id in hold_ids:
                decision = holds[job_id]
                if isinstance(decision, Park):
                    until.append(state.now + recheck)
                    waits.append(decision.key)
                    reserved.append(None)
                else:
                    assert isinstance(decision, Reserve)
                    until.append(decision.at)
                    waits.append(None)
                    reserved.append(decision.at)
            cur = await conn.execute(
                sql.active().FLOW_HOLD,
                {"ids": hold_ids, "until": until, "waits": waits, "reserved": reserved, "recheck": recheck},
            )
            rows = await cur.fetchall()
            if any(row[1] for row in rows):  # the relay sleeps until its next due row: that changed
                await conn.execute(sql.active().FLOW_NOTIFY_RELAY)
            held = {row[0] for row in rows if row[1]}
            not_marked = {row[0] for row in rows if not row[1]}
            for delivery, _ in deliveries:
                if delivery.job_id not in holds:
                    continue
                if delivery.job_id in held or not (delivery.job_id in not_marked or delivery.reclaimed):
                    out.held.append(delivery)
                else:
                    out.unmarked.append(delivery)
    return out


async def release(pool: AsyncConnectionPool[Any], jobs: Iterable[Job]) -> int:
    """Release the slots of jobs whose outcomes are recorded; wake as many parked jobs. Returns woken."""
    done = [(job.id, job.attempt) for job in jobs]
    if not done:
        return 0
    async with pool.connection() as conn:
        cur = await conn.execute(
            sql.active().FLOW_RELEASE, {"ids": [i for i, _ in done], "attempts": [a for _, a in done]}
        )
        row = await cur.fetchone()
        woken = int(row[0]) if row else 0
        if woken:
            await conn.execute(sql.active().FLOW_NOTIFY_RELAY)
    return woken
