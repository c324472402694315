"""``/api/v1/jobs/{id}/move`` and ``/api/v1/jobs/move``: a new priority or run time for waiting jobs.

The operation is :mod:`postbox.app.services.moves` (audited, decided in
PostgreSQL); after its commit the moved jobs' old stream entries are dropped.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from psycopg import AsyncConnection

from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.params import JobId
from postbox.app.api.schemas import MovedJob, MoveManyRequest, MoveRequest, MoveResult
from postbox.app.api.state import Destructive, api_state, db, read_access
from postbox.app.services import moves
from postbox.app.services.audit import Actor
from postbox.app.services.results import as_dict

router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute)


@router.post(
    "/move",
    response_model=MoveResult,
    summary="Change the priority or run time of waiting jobs, by ids or by a filter",
    responses=responses(400, 401, 403, 422),
)
async def move_many(
    body: MoveManyRequest,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
) -> dict[str, Any]:
    st = api_state(request)
    result = await moves.move_jobs(
        conn,
        actor,
        ids=body.ids,
        queue=body.queue,
        task=body.task,
        state=body.state,
        priority=body.priority,
        run_at=body.run_at,
        delay=body.delay_seconds,
        limit=body.limit,
    )
    await moves.drop_old_entries(st.redis, st.settings.redis_prefix, result.moved)
    return as_dict(result)


@router.post(
    "/{job_id}/move",
    response_model=MovedJob,
    summary="Change one waiting job's priority or run time (409 with the reason when it cannot move)",
    responses=responses(400, 401, 403, 404, 409, 422),
)
async def move_one(
    job_id: JobId,
    body: MoveRequest,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
) -> dict[str, Any]:
    st = api_state(request)
    moved = await moves.move_job(
        conn, job_id, actor, priority=body.priority, run_at=body.run_at, delay=body.delay_seconds
    )
    await moves.drop_old_entries(st.redis, st.settings.redis_prefix, [moved])
    return as_dict(moved)
