"""``/api/v1/dlq``: dead letters — list, show, requeue, discard, purge."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from psycopg import AsyncConnection

from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.params import Cursor, JobId, Limit, QueueFilter, TaskFilter
from postbox.app.api.schemas import QUEUE_PATTERN, DeadLetter, DeadPage, DiscardResult, PurgeResult, RequeueResult
from postbox.app.api.state import Contents, Destructive, db, read_access, redacted, redacted_page
from postbox.app.services import dlq
from postbox.app.services.audit import Actor
from postbox.app.services.results import as_dict

router = APIRouter(
    prefix="/dlq", tags=["dead letters"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute
)


@router.get("", response_model=DeadPage, summary="Dead letters, newest first", responses=responses(400, 401, 422))
async def list_dead(
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    queue: QueueFilter = None,
    task: TaskFilter = None,
    discarded: Annotated[bool | None, Query(description="true: only discarded; false: only not discarded.")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    contents: bool = Contents,
) -> dict[str, Any]:
    page = await dlq.list_dead(conn, queue=queue, task=task, discarded=discarded, limit=limit, cursor=cursor)
    return redacted_page(as_dict(page), contents)


@router.post(
    "/purge",
    response_model=PurgeResult,
    summary="Delete a queue's dead letters older than an age (needs confirm=true)",
    responses=responses(400, 401, 403, 422),
)
async def purge(
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    queue: Annotated[str, Query(pattern=QUEUE_PATTERN)],
    older_than: Annotated[
        float, Query(ge=0, le=10**10, description="Seconds since the job died (or was discarded).")
    ] = 0,
    discarded_only: Annotated[bool, Query(description="Only dead letters already discarded.")] = False,
    confirm: Annotated[bool, Query(description="Must be true: purged rows are gone for good.")] = False,
    actor: Actor = Destructive,
) -> dict[str, Any]:
    purged = await dlq.purge_dead(
        conn, queue, older_than=older_than, confirm=confirm, actor=actor, discarded_only=discarded_only
    )
    return as_dict(purged)


@router.get("/{job_id}", response_model=DeadLetter, summary="One dead letter", responses=responses(401, 404, 422))
async def show(
    job_id: JobId, conn: Annotated[AsyncConnection[Any], Depends(db)], contents: bool = Contents
) -> dict[str, Any]:
    return redacted(as_dict(await dlq.get_dead(conn, job_id)), contents)


@router.post(
    "/{job_id}/requeue",
    response_model=RequeueResult,
    summary="Run a dead letter again (through the outbox; attempts reset, history kept)",
    responses=responses(401, 403, 404, 409, 422),
)
async def requeue(
    job_id: JobId, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await dlq.requeue_dead(conn, job_id, actor))


@router.post(
    "/{job_id}/discard",
    response_model=DiscardResult,
    summary="Mark a dead letter discarded (kept until purged)",
    responses=responses(401, 403, 404, 409, 422),
)
async def discard(
    job_id: JobId, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await dlq.discard_dead(conn, job_id, actor))
