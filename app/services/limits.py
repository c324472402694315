"""Flow-control limits as operators see and change them: the logic behind the API, the CLI and the metrics.

Limits are declared in code (published by workers into ``postbox.limits``) and
overridden here: an override is a partial ``{concurrency?, rate?}`` whose keys
win over the declaration (``null`` lifts that limit). Workers reload declared and
override every second, so writing the override is all a change needs: no restart.

Each limit is shown with its declaration, its override, the limits in force
(``effective``), the concurrency slots in use under it (a slot counts while its
job runs under a live lease, as the worker's claim counts it; a partitioned
task's partitions summed) and the jobs of its queue or task held back (waiting
for a slot, or for a rate reservation still ahead).

Writes run in one transaction with their audit row. Bad input raises
:class:`~postbox.app.services.errors.InvalidLimitError` with the offending
field; nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from postbox import flow, sql
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.errors import InvalidLimitError, NotFoundError
from postbox.errors import InvalidOptionError
from postbox.flow import FlowLimit
from postbox.settings import QUEUE_NAME_RE

SCOPES = ("queue", "task")
MAX_NAME = 200


@dataclass(frozen=True)
class Limit:
    """One queue's or task's limits: declared in code, overridden by an operator, in force, and in use.

    ``declared``, ``override`` and ``effective`` are the JSON forms
    ``{concurrency, rate: {limit, period}}`` of ``postbox.flow``.
    """

    scope: str
    name: str
    queue: str | None
    declared: dict[str, Any] | None
    declared_by: str | None
    declared_at: datetime | None
    override: dict[str, Any] | None
    override_by: str | None
    override_at: datetime | None
    effective: dict[str, Any]
    effective_text: str
    in_use: int
    partitions_in_use: int
    held: int
    held_for_slot: int
    held_for_rate: int


# --- validation ----------------------------------------------------------------------


def check_scope(scope: Any) -> str:
    if scope not in SCOPES:
        raise InvalidLimitError(f"unknown scope {scope!r}: one of {', '.join(SCOPES)}", field="scope")
    return str(scope)


def check_name(scope: str, name: Any) -> str:
    """A queue name follows the queue-name rule; a task name is 1-200 characters without NUL."""
    if scope == "queue":
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            raise InvalidLimitError(f"invalid queue name {name!r}: must match {QUEUE_NAME_RE.pattern}", field="name")
        return name
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or "\x00" in name:
        raise InvalidLimitError(f"a task name is 1-{MAX_NAME} characters without NUL, got {name!r}", field="name")
    return name


def check_override(data: Any) -> dict[str, Any]:
    """An override body as ``flow.parse_override`` reads it (its JSON form), or :class:`InvalidLimitError`."""
    try:
        return flow.parse_override(data)
    except InvalidOptionError as exc:
        raise InvalidLimitError(str(exc), field=exc.field or "limits") from None


def check_field(name: Any) -> str | None:
    if name is None:
        return None
    if name not in flow.OVERRIDABLE:
        raise InvalidLimitError(f"unknown limit {name!r}: an override has {', '.join(flow.OVERRIDABLE)}", field="field")
    return str(name)


def target(scope: str, name: str) -> str:
    """The audit target of a limit: ``limit:queue:emails``, ``limit:task:send_receipt``."""
    return f"limit:{scope}:{name}"


# --- views ---------------------------------------------------------------------------


def _declared(row: Mapping[str, Any]) -> FlowLimit | None:
    data = row.get("declared")
    if data is None:
        return None
    try:
        return FlowLimit.from_json(data)
    except Exception:  # a hand-edited row: shown as none rather than failing every listing
        return None


def view(row: Mapping[str, Any]) -> Limit:
    """One limit row as the API and the CLI show it."""
    declared = _declared(row)
    override = row.get("override")
    try:
        effective = flow.effective(declared, override)
    except Exception:  # an unreadable override: the worker ignores the row, so show the declaration
        effective = declared or FlowLimit()
    return Limit(
        scope=row["scope"],
        name=row["name"],
        queue=row.get("queue"),
        declared=None if declared is None else flow.describe(declared),
        declared_by=row.get("declared_by"),
        declared_at=row.get("declared_at"),
        override=override,
        override_by=row.get("override_by"),
        override_at=row.get("override_at"),
        effective=flow.describe(effective),
        effective_text=flow.describe_text(effective),
        in_use=int(row.get("in_use") or 0),
        partitions_in_use=int(row.get("partitions_in_use") or 0),
        held=int(row.get("held") or 0),
        held_for_slot=int(row.get("held_for_slot") or 0),
        held_for_rate=int(row.get("held_for_rate") or 0),
    )


async def _end_read(conn: AsyncConnection[Any]) -> None:
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.INTRANS:
        await conn.commit()


async def _select(conn: AsyncConnection[Any], scope: str | None, name: str | None) -> list[Limit]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().LIMIT_LIST, {"scope": scope, "name": name})
        rows = await cur.fetchall()
    return [view(row) for row in rows]


async def list_limits(conn: AsyncConnection[Any]) -> list[Limit]:
    """Every queue and task with a limit row (declared or overridden), queues first."""
    found = await _select(conn, None, None)
    await _end_read(conn)
    return found


async def get_limit(conn: AsyncConnection[Any], scope: str, name: str) -> Limit:
    scope = check_scope(scope)
    name = check_name(scope, name)
    found = await _select(conn, scope, name)
    await _end_read(conn)
    if not found:
        raise NotFoundError(f"no limits for {scope} {name!r}", details={"scope": scope, "name": name})
    return found[0]


def by_queue(limits: Sequence[Limit]) -> dict[str, list[Limit]]:
    """Limits grouped by queue: a queue's own, then those of its tasks (a task's queue from ``postbox.tasks``)."""
    out: dict[str, list[Limit]] = {}
    for item in limits:
        if item.queue is not None:
            out.setdefault(item.queue, []).append(item)
    return out


async def queue_limits(conn: AsyncConnection[Any]) -> dict[str, list[Limit]]:
    """``{queue: [limit, ...]}`` for the queue stats (``GET /api/v1/queues``); the caller's transaction stays open."""
    return by_queue(await _select(conn, None, None))


# --- writes --------------------------------------------------------------------------


async def set_override(
    conn: AsyncConnection[Any], scope: str, name: str, values: Mapping[str, Any], actor: Actor
) -> Limit:
    """Merge ``values`` (``concurrency``, ``rate``; ``None`` lifts one) into the override; audited.

    Creates the row when the queue or task has none yet (its declaration, if any,
    arrives when a worker that loads it starts). Returns the limit as shown.
    """
    scope = check_scope(scope)
    name = check_name(scope, name)
    given = check_override(values)
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.execute(sql.active().LIMIT_LOCK, {"scope": scope, "name": name})
            before = await cur.fetchone()
            was = await _select(conn, scope, name)
            await cur.execute(
                sql.active().LIMIT_SET_OVERRIDE,
                {"scope": scope, "name": name, "override": orjson.dumps(given).decode(), "by": actor.name},
            )
            after = await cur.fetchone()
        assert after is not None
        await record_audit(
            conn,
            actor,
            "limit.override",
            target(scope, name),
            {"set": given, "before": None if before is None else before[0], "after": after[0]},
        )
        found = await _select(conn, scope, name)
        await _wake_if_raised(conn, was[0] if was else None, found[0])
    return found[0]


async def clear_override(
    conn: AsyncConnection[Any], scope: str, name: str, actor: Actor, *, field: str | None = None
) -> Limit:
    """Lift the override (or one of its fields): the declaration is in force again; audited."""
    scope = check_scope(scope)
    name = check_name(scope, name)
    field = check_field(field)
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.execute(sql.active().LIMIT_LOCK, {"scope": scope, "name": name})
            before = await cur.fetchone()
            if before is None:
                raise NotFoundError(f"no limits for {scope} {name!r}", details={"scope": scope, "name": name})
            was = await _select(conn, scope, name)
            await cur.execute(
                sql.active().LIMIT_CLEAR_OVERRIDE, {"scope": scope, "name": name, "field": field, "by": actor.name}
            )
            after = await cur.fetchone()
        assert after is not None
        await record_audit(
            conn,
            actor,
            "limit.clear",
            target(scope, name),
            {"field": field, "before": before[0], "after": after[0]},
        )
        found = await _select(conn, scope, name)
        await _wake_if_raised(conn, was[0] if was else None, found[0])
    return found[0]


async def _wake_if_raised(conn: AsyncConnection[Any], before: Limit | None, after: Limit) -> None:
    """An override that raised or lifted a concurrency limit wakes the jobs parked on it, in its transaction.

    Workers wake them too when their copy of the limits (reloaded every second) sees
    the raise; a limit lowered and raised again between two reloads is a raise no
    worker sees, and its parked jobs would wait for their recheck (the visibility timeout).
    """
    was = None if before is None else before.effective["concurrency"]
    now = after.effective["concurrency"]
    if was is None or (now is not None and now <= was):
        return  # no concurrency limit before (nothing parked on it), or not raised
    key = flow.queue_key(after.name) if after.scope == "queue" else flow.task_key(after.name)
    cur = await conn.execute(sql.active().JOB_WAKE_PARKED_TO_LIMIT, {"key": key, "limit": now})
    row = await cur.fetchone()
    if row is not None and row[0]:
        await conn.execute(sql.active().OUTBOX_NOTIFY)  # the relay publishes them now


# --- metrics -------------------------------------------------------------------------


def gauges(limits: Sequence[Limit]) -> list[tuple[str, str, dict[str, float]]]:
    """(scope, name, {concurrency?, rate_per_second?, in_use, held}) of each limit, for the exposition."""
    out = []
    for item in limits:
        values: dict[str, float] = {"in_use": float(item.in_use), "held": float(item.held)}
        effective = item.effective
        if effective["concurrency"] is not None:
            values["concurrency"] = float(effective["concurrency"])
        rate = effective["rate"]
        if rate is not None:
            values["rate_per_second"] = rate["limit"] / rate["period"]
        out.append((item.scope, item.name, values))
    return out
