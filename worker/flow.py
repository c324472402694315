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
from postbox.streams import stream_key
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
    waiting: list[tuple[Delivery, float]] = field(default_factory=list)  # (delivery, seconds): claim again then
    unmarked: list[Delivery] = field(default_factory=list)  # publish not marked yet: leave pending


async def claim(
    pool: AsyncConnectionPool[Any],
    deliveries: Sequence[tuple[Delivery, JobKeys]],
    *,
    worker_id: str,
    lease: float,
    recheck: float,
    short_wait: float = 0.0,
) -> FlowClaim:
    """Claim what the limits allow of these deliveries; hold the rest back (one transaction).

    A job whose rate reservation is at most ``short_wait`` seconds away is not held
    back through the relay: it waits in this worker (``FlowClaim.waiting``), so its
    start does not queue behind the stream's backlog when it is published again.
    """
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
        direct = sorted({d.job_id for d, _ in deliveries if d.direct})
        cur = await conn.execute(sql.active().FLOW_LOCK_JOBS, {"ids": ids, "direct": direct})
        locked = await cur.fetchall()
        claimable = {job_id: reserved for job_id, reserved, marked in locked if marked}
        unmarked = {job_id for job_id, _, marked in locked if not marked}
        cur = await conn.execute(sql.active().FLOW_STATE, {"conc_keys": conc_keys, "rate_keys": rate_keys})
        state = State(now=0.0)
        for kind, key, value in await cur.fetchall():
            if kind == "now":
                state.now = value
            elif kind == "used":
                state.used[key] = int(value)
            elif kind == "tat":
                state.tat[key] = value
            else:
                state.stat[key] = value
        decisions = flow.allocate(
            [Candidate(job_id, keys_of[job_id], claimable[job_id]) for job_id in ids if job_id in claimable], state
        )
        starting = {d.job_id for d in decisions if isinstance(d, Start)}
        holds = {d.job_id: d for d in decisions if not isinstance(d, Start)}
        # Jobs neither claimable nor waiting for their mark go through the claim too: it
        # tells skip (finished...) from keep (a reclaimed entry of a job running elsewhere).
        to_claim = [
            d for d, _ in deliveries if d.job_id in starting or (d.job_id not in claimable and d.job_id not in unmarked)
        ]
        out.unmarked = [d for d, _ in deliveries if d.job_id in unmarked]
        if direct and starting:
            due = [job_id for job_id in direct if job_id in starting]
            if due:
                await conn.execute(sql.active().FLOW_DUE_NOW, {"ids": due})
        out.batch = await claims.claim_on(conn, to_claim, worker_id=worker_id, lease=lease)
        slots = [(key, job.id, job.attempt) for job in out.batch.run for key, _ in keys_of[job.id].concurrency]
        for job in out.batch.run:
            job.flow_slots = bool(keys_of[job.id].concurrency)
        if out.batch.run or state.changed:
            changed = sorted(state.changed)
            cells = [state.cells(key) for key in changed]
            await conn.execute(
                sql.active().FLOW_TAKE,
                {
                    "slot_keys": [k for k, _, _ in slots],
                    "slot_ids": [j for _, j, _ in slots],
                    "slot_attempts": [a for _, _, a in slots],
                    "rate_keys": changed,
                    "tats": [tat for tat, _ in cells],
                    "stats": [stat for _, stat in cells],
                    "claimed": [job.id for job in out.batch.run],  # their hold-back marks are cleared
                },
            )
        near = {
            job_id: d
            for job_id, d in holds.items()
            if isinstance(d, Reserve) and d.at - state.now <= short_wait and job_id in claimable
        }
        if near:
            ids_near = sorted(near)
            cur = await conn.execute(
                sql.active().FLOW_RESERVE_IN_PLACE,
                {"ids": ids_near, "tokens": [near[i].token_at for i in ids_near]},
            )
            in_place = {row[0] for row in await cur.fetchall()}  # queued rows (not a stale run's)
            waited: set[int] = set()
            for delivery, _ in deliveries:
                if delivery.job_id in in_place and delivery.job_id not in waited:
                    waited.add(delivery.job_id)
                    out.waiting.append((delivery, max(0.0, near[delivery.job_id].at - state.now)))
                elif delivery.job_id in in_place:
                    out.batch.skip.append(delivery)  # the same job read twice: one waits
            for job_id in in_place:
                del holds[job_id]
        if holds:
            hold_ids = sorted(holds)
            until: list[float] = []
            waits: list[str | None] = []
            reserved: list[float | None] = []
            for job_id in hold_ids:
                decision = holds[job_id]
                if isinstance(decision, Park):
                    until.append(state.now + recheck)  # (FLOW_HOLD backs the recheck off)
                    waits.append(decision.key)
                    reserved.append(None)  # a token it holds, it keeps
                else:
                    assert isinstance(decision, Reserve)
                    until.append(decision.at)
                    waits.append(None)
                    reserved.append(decision.token_at)
            cur = await conn.execute(
                sql.active().FLOW_HOLD,
                {
                    "ids": hold_ids,
                    "until": until,
                    "waits": waits,
                    "reserved": reserved,
                    "recheck": recheck,
                    "direct": direct,
                },
            )
            rows = await cur.fetchall()
            if any(row[1] for row in rows):  # the relay sleeps until its next due row: that changed
                await conn.execute(sql.active().FLOW_NOTIFY_RELAY)
            held = {row[0] for row in rows if row[1]}
            for delivery, _ in deliveries:
                if delivery.job_id not in holds:
                    continue
                # Held: acknowledge. Not held (the row changed under us: finished, or running
                # again under a live claim): acknowledge unless it is a reclaimed entry.
                if delivery.job_id in held or not delivery.reclaimed:
                    out.held.append(delivery)
                else:
                    out.batch.keep.append(delivery)
    return out


async def release(pool: AsyncConnectionPool[Any], jobs: Iterable[Job]) -> dict[str, int]:
    """Release the slots of jobs whose outcomes are recorded; returns how many were freed per key."""
    done = [(job.id, job.attempt) for job in jobs]
    if not done:
        return {}
    async with pool.connection() as conn:
        cur = await conn.execute(
            sql.active().FLOW_RELEASE, {"ids": [i for i, _ in done], "attempts": [a for _, a in done]}
        )
        return {key: n for key, n in await cur.fetchall()}


async def parked(pool: AsyncConnectionPool[Any], freed: dict[str, int], prefix: str) -> list[tuple[str, Delivery]]:
    """Up to ``freed[key]`` jobs parked on each key: (key, a delivery with no stream entry, ``direct``)."""
    keys = sorted(freed)
    async with pool.connection() as conn:
        cur = await conn.execute(sql.active().FLOW_PARKED, {"keys": keys, "counts": [freed[k] for k in keys]})
        rows = await cur.fetchall()
    out = []
    for key, job_id, queue, task, args, headers, priority, enq in rows:
        stream = stream_key(prefix, queue, priority)
        out.append((key, Delivery(stream, b"", job_id, task, args, headers, queue, priority, enq, direct=True)))
    return out


async def wake(pool: AsyncConnectionPool[Any], counts: dict[str, int]) -> int:
    """Wake up to ``counts[key]`` parked jobs per key through the relay; returns how many."""
    keys = sorted(k for k, n in counts.items() if n > 0)
    if not keys:
        return 0
    async with pool.connection() as conn:
        cur = await conn.execute(sql.active().FLOW_WAKE, {"keys": keys, "counts": [counts[k] for k in keys]})
        row = await cur.fetchone()
        woken = int(row[0]) if row else 0
        if woken:
            await conn.execute(sql.active().FLOW_NOTIFY_RELAY)
    return woken
