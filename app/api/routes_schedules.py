"""``/api/v1/schedules``: periodic jobs — list, pause, resume, trigger now.

Reads are open like the other reads; pause, resume and trigger are destructive
(``X-API-Key`` when a key is configured) and each writes an audit row. A
schedule's args are not shown here: they are code, and may hold what a job
listing would redact.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from psycopg import AsyncConnection

from postbox.app.api.errors import responses
from postbox.app.api.shapes import list_of, response_model
from postbox.app.api.state import Destructive, api_state, db, read_access
from postbox.app.services import schedules as schedule_service
from postbox.app.services.audit import Actor
from postbox.app.services.results import as_dict

router = APIRouter(prefix="/schedules", tags=["schedules"], dependencies=[Depends(read_access)])

ScheduleName = Annotated[
    str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$", description="Schedule.")
]

# A schedule's args are left out (see above).
ScheduleOut = response_model(schedule_service.Schedule, "ScheduleOut", omit={"args"})
Triggered = response_model(schedule_service.TriggerResult, "Triggered")


@router.get(
    "", response_model=list_of(ScheduleOut), summary="Every schedule (removed ones flagged)", responses=responses(401)
)
async def list_schedules(conn: Annotated[AsyncConnection[Any], Depends(db)]) -> list[dict[str, Any]]:
    return [as_dict(item) for item in await schedule_service.list_schedules(conn)]


@router.get("/{name}", response_model=ScheduleOut, summary="One schedule", responses=responses(401, 404, 422))
async def get_schedule(name: ScheduleName, conn: Annotated[AsyncConnection[Any], Depends(db)]) -> dict[str, Any]:
    return as_dict(await schedule_service.get_schedule(conn, name))


@router.post("/{name}/pause", response_model=ScheduleOut, summary="Pause a schedule", responses=responses(401, 404))
async def pause(
    name: ScheduleName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await schedule_service.set_paused(conn, name, True, actor))


@router.post(
    "/{name}/resume",
    response_model=ScheduleOut,
    summary="Resume a schedule (occurrences that fell while paused are skipped)",
    responses=responses(401, 404),
)
async def resume(
    name: ScheduleName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await schedule_service.set_paused(conn, name, False, actor))


@router.post(
    "/{name}/trigger",
    response_model=Triggered,
    status_code=201,
    summary="Enqueue one run now",
    responses=responses(401, 404, 409),
)
async def trigger(
    name: ScheduleName,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
) -> dict[str, Any]:
    st = api_state(request)
    fired = await schedule_service.trigger(conn, name, actor, redis=st.redis, prefix=st.settings.redis_prefix)
    return as_dict(fired)
