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

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from postbox import flow, sql
from postbox.db import SessionBounds
from postbox.flow import Candidate, FlowLimit, JobKeys, Limits, Park, Reserve, Start, State
from postbox.registry import Registry
from postbox.streams import stream_key
from postbox.worker import claims
from postbox.worker.delivery import Delivery, Job

log = logging.getLogger(__name__)


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
        sql.active().LIMIT_UPSERT_DECLARED,
        {
            "scopes": [scope for scope, _, _ in rows],
            "names": [name for _, name, _ in rows],
            "declared": [None if lim.empty else orjson.dumps(lim.to_json()).decode() for _, _, lim in rows],
            "by": by,
        },
    )


async def load(conn: AsyncConnection[Any], queues: Sequence[str], tasks: Sequence[str]) -> Limits:
    """The limits in force for these queues and tasks: the published declaration, the override on top."""
    cur = await conn.execute(sql.active().LIMIT_GET_IN_FORCE, {"queues": list(queues), "tasks": list(tasks)})
    return in_force(await cur.fetchall())


def in_force(rows: Iterable[Sequence[Any]]) -> Limits:
    """Limits from ``limits`` rows (scope, name, declared, override)."""
    limits = Limits()
    for scope, name, declared_json, override in rows:
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


class PauseInClaim:
    """A test signal: freeze a worker inside its limited claim, its keys' locks held.

    With ``POSTBOX_TEST_PAUSE_IN_CLAIM=<path>`` set, the first limited claim of the
    process, once it holds its keys' locks and has read their state, writes its pid
    to ``<path>`` and waits until the file is removed. A system test SIGSTOPs the
    worker there (docs/flow-control.md#faults). Unset (production), it costs one
    environment lookup per process.
    """

    ENV = "POSTBOX_TEST_PAUSE_IN_CLAIM"

    def __init__(self) -> None:
        self._path: str | None = None
        self._read = False

    async def __call__(self) -> None:
        if not self._read:
            self._read = True
            self._path = os.environ.get(self.ENV) or None
        path, self._path = self._path, None  # once per process
        if path is None:
            return
        await asyncio.to_thread(self._hold, Path(path))

    @staticmethod
    def _hold(marker: Path) -> None:
        marker.write_text(str(os.getpid()))
        while marker.exists():
            time.sleep(0.01)


pause_in_claim = PauseInClaim()


async def claim(
    pool: AsyncConnectionPool[Any],
    deliveries: Sequence[Delivery],
    *,
    worker_id: str,
    lease: float,
    recheck: float,
    short_wait: float = 0.0,
    relay_poll: float = 0.5,
    bounds: SessionBounds | None = None,
) -> FlowClaim:
    """Claim what the limits allow of these deliveries; hold the rest back (one transaction).

    The limits are read in the transaction, share-locked (``sql.LIMIT_GET_IN_FORCE_LOCKED``),
    not taken from the worker's cached copy: a change committed before the claim
    decides is obeyed, whatever the worker missed (it was frozen). ``bounds`` are
    set for the transaction (``postbox.db.claim_bounds``): a claim that stalls while
    holding its keys' locks is cut off, and they are freed for every other worker.

    A job whose rate reservation is at most ``short_wait`` seconds away is not held
    back through the relay: it waits in this worker (``FlowClaim.waiting``), so its
    start does not queue behind the stream's backlog when it is published again.
    """
    out = FlowClaim()
    if not deliveries:
        return out
    async with pool.connection() as conn, conn.transaction():
        # No statement of this transaction may be the last of a pipeline while it holds
        # a lock: PostgreSQL (15, 16) does not arm idle_in_transaction_session_timeout
        # after the Flush that ends psycopg's pipeline, so a worker frozen right there
        # would hold the lock for good. Each pipeline is followed by a plain statement.
        if bounds is not None:
            await bounds.apply(conn, local=True)
        limits_cur = await conn.execute(
            sql.active().LIMIT_GET_IN_FORCE_LOCKED,
            {"queues": sorted({d.queue for d in deliveries}), "tasks": sorted({d.task for d in deliveries})},
        )
        limits = in_force(await limits_cur.fetchall())
        keys_of: dict[int, JobKeys] = {}
        for delivery in deliveries:
            if delivery.job_id not in keys_of:
                keys_of[delivery.job_id] = limits.keys(delivery.queue, delivery.task, delivery.args)
        conc_keys = sorted({key for keys in keys_of.values() for key, _ in keys.concurrency})
        rate_keys = sorted({key for keys in keys_of.values() for key, _ in keys.rate})
        conc_limit = {key: limit for keys in keys_of.values() for key, limit in keys.concurrency}
        ids = sorted(keys_of)
        direct = sorted({d.job_id for d in deliveries if d.direct})
        # One round trip for the keys' locks, the rows and the keys' state (the server runs
        # them in order: the state is read under the locks).
        async with conn.pipeline():
            await conn.execute(sql.active().LIMIT_LOCK_KEYS, {"keys": sorted({*conc_keys, *rate_keys})})
            jobs_cur = await conn.execute(sql.active().JOB_LOCK_FOR_LIMITS, {"ids": ids, "direct": direct})
            locked = await jobs_cur.fetchall()
        state_cur = await conn.execute(sql.active().LIMIT_GET_STATE, {"conc_keys": conc_keys, "rate_keys": rate_keys})
        state_rows = await state_cur.fetchall()
        reserved_of = {job_id: reserved for job_id, reserved, _, _ in locked}
        unmarked = {job_id for job_id, _, marked, _ in locked if not marked}
        stale = {job_id for job_id, _, _, running in locked if running}
        state = State(now=0.0)
        dead: dict[str, int] = {}  # slots freed by a lease's expiry
        for kind, key, value in state_rows:
            if kind == "now":
                state.now = value
            elif kind == "used":
                state.used[key] = int(value)
            elif kind == "tat":
                state.tat[key] = value
            elif kind == "stat":
                state.stat[key] = value
            else:
                dead[key] = int(value)
        await pause_in_claim()
        # Every locked row may start (a claim may beat the relay's mark); only a hold-back
        # needs the mark (written before it, the mark would overwrite it).
        decisions = flow.allocate(
            [Candidate(job_id, keys_of[job_id], reserved_of[job_id]) for job_id in ids if job_id in reserved_of],
            state,
        )
        starting = {d.job_id for d in decisions if isinstance(d, Start)}
        holds = {d.job_id: d for d in decisions if not isinstance(d, Start)}
        # Jobs not locked go through the claim too: it ends the expired, and tells skip
        # (finished...) from keep (a reclaimed entry of a job running elsewhere).
        to_claim = [d for d in deliveries if d.job_id in starting or d.job_id not in reserved_of]
        if direct and starting:
            due = [job_id for job_id in direct if job_id in starting]
            if due:
                await conn.execute(sql.active().JOB_MAKE_DUE, {"ids": due})
        out.batch = await claims.claim_on(conn, to_claim, worker_id=worker_id, lease=lease)
        slots = [(key, job.id, job.attempt) for job in out.batch.run for key, _ in keys_of[job.id].concurrency]
        for job in out.batch.run:
            job.flow_slots = bool(keys_of[job.id].concurrency)
        # Waiting in this worker, the entry left pending: a near reservation; and, until
        # the relay's mark, any hold-back (a reservation's token is written at once). Not
        # a stale run's row (running): that one is held back through the relay.
        later: dict[int, float | None] = {}  # job id -> seconds (None: look again shortly, not marked yet)
        tokens: dict[int, float] = {}
        for job_id, decision in list(holds.items()):
            wait = decision.at - state.now if isinstance(decision, Reserve) else None
            near = wait is not None and wait <= short_wait
            if job_id in stale:
                continue
            if job_id in unmarked or (near and job_id not in direct):
                if isinstance(decision, Reserve):
                    tokens[job_id] = decision.token_at
                later[job_id] = max(0.0, wait) if near and wait is not None else None
                del holds[job_id]
        hold_ids = sorted(holds)
        until: list[float] = []
        waits: list[str | None] = []
        reserved: list[float | None] = []
        for job_id in hold_ids:
            decision = holds[job_id]
            if isinstance(decision, Park):
                until.append(state.now + recheck)  # (JOB_HOLD_BACK backs the recheck off)
                waits.append(decision.key)
                reserved.append(None)  # a token it holds, it keeps
            else:
                assert isinstance(decision, Reserve)
                until.append(decision.at)
                waits.append(None)
                reserved.append(decision.token_at)
        # One round trip for what the decisions write: slots and cells, tokens, hold-backs.
        held_rows: list[Any] = []
        async with conn.pipeline():
            if out.batch.run or state.changed:
                changed = sorted(state.changed)
                cells = [state.cells(key) for key in changed]
                await conn.execute(
                    sql.active().LIMIT_TAKE,
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
            if tokens:
                ids_tok = sorted(tokens)
                await conn.execute(
                    sql.active().JOB_SET_RATE_TOKEN, {"ids": ids_tok, "tokens": [tokens[i] for i in ids_tok]}
                )
            if hold_ids:
                hold_cur = await conn.execute(
                    sql.active().JOB_HOLD_BACK,
                    {
                        "ids": hold_ids,
                        "until": until,
                        "waits": waits,
                        "reserved": reserved,
                        "recheck": recheck,
                        "direct": direct,
                    },
                )
                # The relay sleeps until its next due row, at most its poll interval: wake it
                # only if a hold-back falls due before that (a NOTIFY serializes commits).
                if min(until) < state.now + relay_poll:
                    await conn.execute(sql.active().OUTBOX_NOTIFY)
            # Slots whose lease expired were freed by this claim, not by a release: wake
            # as many jobs parked on those keys as the keys still have room for.
            room = {key: min(n, conc_limit[key] - state.used.get(key, 0)) for key, n in dead.items()}
            room = {key: n for key, n in room.items() if n > 0}
            if room:
                keys = sorted(room)
                await conn.execute(sql.active().JOB_WAKE_PARKED, {"keys": keys, "counts": [room[k] for k in keys]})
                await conn.execute(sql.active().OUTBOX_NOTIFY)
            if hold_ids:
                held_rows = await hold_cur.fetchall()
        await conn.execute(sql.active().DATABASE_NOW)  # a plain statement: the idle bound is armed again
        waited: set[int] = set()
        for delivery in deliveries:
            if delivery.job_id not in later:
                continue
            if delivery.job_id in waited:
                out.batch.skip.append(delivery)  # the same job read twice: one waits
                continue
            waited.add(delivery.job_id)
            delay = later[delivery.job_id]
            if delay is None:
                out.unmarked.append(delivery)
            else:
                out.waiting.append((delivery, delay))
        if hold_ids:
            held = {row[0] for row in held_rows if row[1]}
            for delivery in deliveries:
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
            sql.active().LIMIT_SLOT_RELEASE, {"ids": [i for i, _ in done], "attempts": [a for _, a in done]}
        )
        return {key: n for key, n in await cur.fetchall()}


async def parked(pool: AsyncConnectionPool[Any], freed: dict[str, int], prefix: str) -> list[tuple[str, Delivery]]:
    """Up to ``freed[key]`` jobs parked on each key: (key, a delivery with no stream entry, ``direct``)."""
    keys = sorted(freed)
    async with pool.connection() as conn:
        cur = await conn.execute(sql.active().JOB_GET_PARKED, {"keys": keys, "counts": [freed[k] for k in keys]})
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
        cur = await conn.execute(sql.active().JOB_WAKE_PARKED, {"keys": keys, "counts": [counts[k] for k in keys]})
        row = await cur.fetchone()
        woken = int(row[0]) if row else 0
        if woken:
            await conn.execute(sql.active().OUTBOX_NOTIFY)
    return woken


def raised(before: Limits, after: Limits) -> list[tuple[str, int | None]]:
    """The concurrency keys (``queue:q``, ``task:t``: a task's partitions too) whose limit a change
    raised or lifted, with the new limit (None: lifted). A worker's first load counts as a change."""
    out: list[tuple[str, int | None]] = []
    for scope, old, new in (("queue", before.queues, after.queues), ("task", before.tasks, after.tasks)):
        for name in sorted(set(old) | set(new)):
            was = old[name].concurrency if name in old else None
            now = new[name].concurrency if name in new else None
            if name in old and was is None:
                continue  # no concurrency limit before: nothing is parked on it
            if now is None or was is None or now > was:
                key = flow.queue_key(name) if scope == "queue" else flow.task_key(name)
                out.append((key, now))
    return out


async def wake_to_limit(pool: AsyncConnectionPool[Any], changes: Sequence[tuple[str, int | None]]) -> int:
    """Wake the jobs parked on keys whose limit was raised or lifted, up to the room it leaves."""
    if not changes:
        return 0
    woken = 0
    async with pool.connection() as conn:
        for key, limit in changes:
            cur = await conn.execute(sql.active().JOB_WAKE_PARKED_TO_LIMIT, {"key": key, "limit": limit})
            row = await cur.fetchone()
            woken += int(row[0]) if row else 0
        if woken:
            await conn.execute(sql.active().OUTBOX_NOTIFY)
    return woken
