"""Schedules in the database: synchronised from code, and ticked by the leader.

:func:`sync` writes the declared schedules of a process into
``{schema}.schedules`` (relays and workers call it when they start, with the
task modules they loaded) and marks as removed the schedules of the process's
own tasks that its code no longer declares. Schedules of tasks the process did
not load are left alone, so a worker that loads only some modules never
removes another module's schedules.

:func:`tick` is what the leading relay runs, on its lock session: in one
transaction it locks the due schedules, decides their occurrences
(:func:`postbox.occurrences.due`), records each occurrence in
``schedule_runs`` — primary key (schedule, occurrence) — inserts its job in
the outbox, and moves the schedule's cursor past it. Either all of that
commits or none of it; a later leader reads the moved cursor, and even a
stale computation could not insert an occurrence twice.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from psycopg import AsyncConnection, OperationalError
from psycopg.errors import UndefinedTable
from psycopg.rows import dict_row

from postbox import sql
from postbox.errors import InvalidOptionError
from postbox.occurrences import CatchUp, Due, Timing, due, next_after
from postbox.periodic import Schedule, ScheduleBook
from postbox.registry import Registry

log = logging.getLogger(__name__)
BROKEN_RETRY = timedelta(minutes=1)  # a stored schedule that cannot be evaluated is looked at again then


@dataclass
class SyncReport:
    inserted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


async def db_now(conn: AsyncConnection[Any]) -> datetime:
    cur = await conn.execute(sql.active().DATABASE_NOW)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def sync(
    conn: AsyncConnection[Any], schedules: Iterable[Schedule], tasks: Iterable[str], *, now: datetime | None = None
) -> SyncReport:
    """Write ``schedules`` and remove the undeclared schedules of ``tasks``; one transaction.

    ``tasks`` are the task names this process loaded (it owns their schedules).
    ``now`` pins the clock (tests); by default the database's.
    """
    declared = list(schedules)
    owned = sorted(set(tasks) | {s.task for s in declared})
    report = SyncReport()
    async with conn.transaction():
        moment = now if now is not None else await db_now(conn)
        if declared:
            cur = await conn.execute(
                sql.active().SCHEDULE_UPSERT_DECLARED,
                {
                    "now": moment,
                    "name": [s.name for s in declared],
                    "task": [s.task for s in declared],
                    "queue": [s.queue for s in declared],
                    "priority": [s.priority for s in declared],
                    "max_attempts": [s.max_attempts for s in declared],
                    "args": [orjson.dumps(s.args).decode() for s in declared],
                    "cron": [s.timing.cron for s in declared],
                    # Cast like grace: psycopg refuses a list mixing int and float (every=60, every=90.5).
                    "every": [None if s.timing.every is None else float(s.timing.every) for s in declared],
                    "tz": [s.timing.tz for s in declared],
                    "catch_up": [s.timing.catch_up for s in declared],
                    "max_catch_up": [s.timing.max_catch_up for s in declared],
                    "grace": [float(s.timing.grace) for s in declared],
                    "next_run": [next_after(s.timing, moment) for s in declared],
                },
            )
            for name, inserted in await cur.fetchall():
                (report.inserted if inserted else report.updated).append(name)
        if owned:
            cur = await conn.execute(
                sql.active().SCHEDULE_MARK_REMOVED, {"tasks": owned, "names": [s.name for s in declared]}
            )
            report.removed = sorted(row[0] for row in await cur.fetchall())
    if report.inserted or report.updated or report.removed:
        log.info(
            "schedules synchronised",
            extra={"inserted": len(report.inserted), "updated": len(report.updated), "removed": report.removed},
        )
    return report


@functools.lru_cache(maxsize=4096)
def timing_of(
    cron: str | None, every: float | None, tz: str, catch_up: CatchUp, max_catch_up: int, grace: float
) -> Timing:
    """A stored schedule's :class:`Timing` (cached: 10,000 schedules on one expression parse it once)."""
    return Timing(cron=cron, every=every, tz=tz, catch_up=catch_up, max_catch_up=max_catch_up, grace=grace)


@dataclass(frozen=True)
class Fired:
    """One occurrence enqueued by a tick."""

    schedule: str
    task: str
    queue: str
    job_id: int
    occurrence: datetime
    lateness: float  # seconds between the occurrence and the tick's clock


@dataclass
class TickReport:
    now: datetime
    looked_at: int = 0  # schedules due and locked
    fired: list[Fired] = field(default_factory=list)
    skipped: int = 0  # missed occurrences the catch-up policies left out
    full: bool = False  # the batch was full: more may be due


async def tick(
    conn: AsyncConnection[Any],
    *,
    now: datetime | None = None,
    limit: int = 1000,
    timeout_ms: int | None = None,
    before_commit: Callable[[TickReport], Awaitable[None]] | None = None,
) -> TickReport:
    """Enqueue the due occurrences of up to ``limit`` schedules in one transaction.

    ``now`` pins the clock (tests); by default the database's. ``timeout_ms``
    bounds how long the transaction may sit idle (the leader passes its session
    timeout, so a leader frozen mid-tick loses its session and its lock).
    ``before_commit`` is a test hook, awaited when everything is written and
    the COMMIT not yet sent (a leader dying there is the case to prove).
    """
    statements = sql.active()
    async with conn.transaction():
        if timeout_ms is not None:
            await conn.execute(statements.TRANSACTION_SET_IDLE_TIMEOUT, {"ms": str(int(timeout_ms))})
        moment = now if now is not None else await db_now(conn)
        report = TickReport(now=moment)
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(statements.SCHEDULE_LOCK_DUE, {"now": moment, "limit": limit})
            rows = await cur.fetchall()
        report.looked_at = len(rows)
        report.full = len(rows) >= limit
        if not rows:
            return report
        plans: list[tuple[dict[str, Any], list[datetime], datetime, datetime]] = []
        decided: dict[tuple[Timing, datetime], Due] = {}  # schedules on one expression and cursor: one decision
        for row in rows:
            try:
                timing = timing_of(
                    row["cron"],
                    row["every_seconds"],
                    row["tz"],
                    row["catch_up"],
                    row["max_catch_up"],
                    row["grace_seconds"],
                )
            except InvalidOptionError as exc:  # edited by hand, or a zone gone from tzdata: not the tick's end
                log.error("schedule cannot be evaluated", extra={"schedule": row["name"], "error": str(exc)})
                plans.append((row, [], row["cursor_at"], moment + BROKEN_RETRY))
                continue
            key = (timing, row["cursor_at"])
            decision = decided.get(key)
            if decision is None:
                decision = decided[key] = due(timing, row["cursor_at"], moment)
            report.skipped += decision.skipped
            if decision.skipped:
                log.warning(
                    "missed occurrences skipped",
                    extra={"schedule": row["name"], "skipped": decision.skipped, "catch_up": timing.catch_up},
                )
            plans.append((row, decision.enqueue, decision.cursor, decision.next_run))
        occurrences = [(row, at) for row, ats, _, _ in plans for at in ats]
        by_id: dict[int, tuple[dict[str, Any], datetime]] = {}
        if occurrences:
            cur2 = await conn.execute(statements.JOB_NEXT_IDS, {"n": len(occurrences)})
            ids = sorted(r[0] for r in await cur2.fetchall())
            by_id = {job_id: occ for job_id, occ in zip(ids, occurrences, strict=True)}
            rows_json = [
                {
                    "id": job_id,
                    "name": row["name"],
                    "at": at,
                    "task": row["task"],
                    "queue": row["queue"],
                    "args": orjson.Fragment(row["args"]),
                    "priority": row["priority"],
                    "max_attempts": row["max_attempts"],
                }
                for job_id, (row, at) in zip(ids, occurrences, strict=True)
            ]
            cur2 = await conn.execute(
                statements.SCHEDULE_RUN_INSERT, {"rows": orjson.dumps(rows_json).decode(), "manual": False}
            )
            for job_id, queue, task, schedule in await cur2.fetchall():
                at = by_id[job_id][1]
                lateness = max(0.0, (moment - at).total_seconds())
                report.fired.append(Fired(schedule, task, queue, job_id, at, lateness))
        last: dict[str, Fired] = {}
        for fired in report.fired:
            if fired.schedule not in last or fired.occurrence > last[fired.schedule].occurrence:
                last[fired.schedule] = fired
        advance = [
            {
                "name": row["name"],
                "cursor_at": cursor,
                "next_run_at": next_run,
                "last_run_at": last[row["name"]].occurrence if row["name"] in last else None,
                "last_job_id": last[row["name"]].job_id if row["name"] in last else None,
            }
            for row, _, cursor, next_run in plans
        ]
        await conn.execute(statements.SCHEDULE_ADVANCE, {"rows": orjson.dumps(advance).decode()})
        if before_commit is not None:
            await before_commit(report)
    return report


async def next_due(conn: AsyncConnection[Any]) -> tuple[datetime | None, datetime]:
    """(the earliest next run of an active schedule or None, the database's now)."""
    cur = await conn.execute(sql.active().SCHEDULE_NEXT_DUE)
    row = await cur.fetchone()
    assert row is not None
    return row[0], row[1]


async def prune_runs(conn: AsyncConnection[Any], *, older_than: float, limit: int = 10_000) -> int:
    """Delete up to ``limit`` occurrence rows enqueued more than ``older_than`` seconds ago.

    Only the cursor decides what a tick looks at; old rows are history (and a
    second guard for recent occurrences), so a week of them is plenty.
    """
    cur = await conn.execute(sql.active().SCHEDULE_RUN_DELETE_OLD, {"age": older_than, "limit": limit})
    return cur.rowcount


async def sync_at_start(database_url: str, book: ScheduleBook, registry: Registry) -> SyncReport | None:
    """A process's start: sync ``book`` for the tasks of ``registry`` on a connection of its own.

    Nothing loaded, nothing done. A database that cannot be reached, or has no
    schedules table yet (not migrated), is logged and skipped: the process runs,
    and the schedules are synchronised at the next start.
    """
    if not len(book) and not len(registry):
        return None
    try:
        conn = await AsyncConnection.connect(database_url, autocommit=True, application_name="postbox-schedules")
    except OperationalError as exc:  # the process copes with the database being away; so do its schedules
        log.warning("schedules not synchronised: database unavailable", extra={"error": str(exc).strip()})
        return None
    try:
        return await sync(conn, book.all(), registry.names())
    except UndefinedTable:
        log.warning("no schedules table: run `postbox migrate`; schedules not synchronised")
        return None
    finally:
        await conn.close()
