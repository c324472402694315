"""Operating schedules: list, pause, resume, trigger now. Shared by the REST API and the CLI.

Pause, resume and trigger are destructive operations: each writes an audit row
in the transaction that makes the change. Resuming skips the occurrences that
fell while the schedule was paused (its next run is computed by the leader at
its next look, within the duty's refresh interval). Triggering enqueues one job
at once, recorded in ``schedule_runs`` as a manual run at the database's now;
it does not move the schedule's cursor, so the regular occurrences go on as
planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.checks import check_text
from postbox.app.services.errors import ConflictError, InvalidInputError, NotFoundError
from postbox.app.services.events import publish_event
from postbox.periodic import SCHEDULE_NAME_RE


def check_schedule_name(name: str) -> str:
    check_text(name, "name")
    if not SCHEDULE_NAME_RE.match(name):
        raise InvalidInputError(f"invalid schedule name {name!r}", field="name")
    return name


@dataclass(frozen=True)
class Schedule:
    """A schedule as the API and the CLI show it (``expression``: its cron, or ``every Ns``).

    The API's response model is derived from these fields (postbox.app.api.shapes), less ``args``.
    """

    name: str
    task: str
    queue: str
    priority: int
    expression: str
    cron: str | None
    every_seconds: float | None
    tz: str
    args: dict[str, Any]
    catch_up: str
    max_catch_up: int
    grace_seconds: float
    paused: bool
    removed: bool
    removed_at: datetime | None
    next_run_at: datetime | None
    last_run_at: datetime | None
    last_job_id: int | None
    last_job_state: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class TriggerResult:
    """The job a manual trigger enqueued, and the moment recorded as its occurrence."""

    schedule: str
    job_id: int
    queue: str
    task: str
    occurrence: datetime


def summary(row: dict[str, Any]) -> Schedule:
    """A schedule row as the API and the CLI show it."""
    expression = row["cron"] if row["cron"] is not None else f"every {row['every_seconds']:g}s"
    return Schedule(
        name=row["name"],
        task=row["task"],
        queue=row["queue"],
        priority=row["priority"],
        expression=expression,
        cron=row["cron"],
        every_seconds=row["every_seconds"],
        tz=row["tz"],
        args=row["args"],
        catch_up=row["catch_up"],
        max_catch_up=row["max_catch_up"],
        grace_seconds=row["grace_seconds"],
        paused=row["paused"],
        removed=row["removed_at"] is not None,
        removed_at=row["removed_at"],
        next_run_at=None if row["removed_at"] is not None else row["next_run_at"],
        last_run_at=row["last_run_at"],
        last_job_id=row["last_job_id"],
        last_job_state=row["last_job_state"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


async def list_schedules(conn: AsyncConnection[Any], name: str | None = None) -> list[Schedule]:
    """Every schedule (removed ones too, flagged), by name."""
    if name is not None:
        check_schedule_name(name)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().SCHEDULE_LIST, {"name": name})
        rows = await cur.fetchall()
    await _end_read(conn)
    return [summary(row) for row in rows]


async def get_schedule(conn: AsyncConnection[Any], name: str) -> Schedule:
    found = await list_schedules(conn, name)
    if not found:
        raise NotFoundError(f"schedule {name!r} not found", details={"name": name})
    return found[0]


async def _end_read(conn: AsyncConnection[Any]) -> None:
    if not conn.autocommit:
        await conn.commit()


async def _lock(conn: AsyncConnection[Any], name: str) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().SCHEDULE_LOCK, {"name": name})
        row = await cur.fetchone()
    if row is None:
        raise NotFoundError(f"schedule {name!r} not found", details={"name": name})
    return row


async def set_paused(conn: AsyncConnection[Any], name: str, paused: bool, actor: Actor) -> Schedule:
    """Pause or resume a schedule; audited. Pausing a paused one (or resuming an active one) changes nothing."""
    check_schedule_name(name)
    async with conn.transaction():
        await _lock(conn, name)
        await conn.execute(sql.active().SCHEDULE_SET_PAUSED, {"name": name, "paused": paused})
        await record_audit(conn, actor, "schedule.pause" if paused else "schedule.resume", f"schedule:{name}")
    return await get_schedule(conn, name)


async def trigger(
    conn: AsyncConnection[Any], name: str, actor: Actor, *, redis: Any = None, prefix: str = "postbox"
) -> TriggerResult:
    """Enqueue one run of the schedule now (a removed schedule is refused); audited. Returns the job."""
    check_schedule_name(name)
    statements = sql.active()
    async with conn.transaction():
        row = await _lock(conn, name)
        if row["removed_at"] is not None:
            raise ConflictError(f"schedule {name!r} was removed from the code", details={"name": name})
        cur = await conn.execute(statements.JOB_NEXT_IDS, {"n": 1})
        id_row = await cur.fetchone()
        assert id_row is not None
        job_id, now = int(id_row[0]), id_row[1]
        occurrence = {
            "id": job_id,
            "name": name,
            "at": now,
            "task": row["task"],
            "queue": row["queue"],
            "args": orjson.Fragment(row["args"]),
            "priority": row["priority"],
            "max_attempts": row["max_attempts"],
        }
        cur = await conn.execute(
            statements.SCHEDULE_RUN_INSERT, {"rows": orjson.dumps([occurrence]).decode(), "manual": True}
        )
        if not await cur.fetchall():  # a run at this very microsecond exists already
            raise ConflictError(f"schedule {name!r} has a run at {now.isoformat()} already", details={"name": name})
        await conn.execute(statements.SCHEDULE_SET_LAST, {"name": name, "at": now, "job": job_id})
        await record_audit(conn, actor, "schedule.trigger", f"schedule:{name}", {"job_id": job_id})
    await publish_event(redis, prefix, "enqueued", job_id=job_id, queue=row["queue"], task=row["task"])
    return TriggerResult(schedule=name, job_id=job_id, queue=row["queue"], task=row["task"], occurrence=now)
