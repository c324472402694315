"""``/api/v1/workflows``: workflows — list (by status, name), get (jobs, states, edges), cancel, retry.

Reads are open like the other reads; cancel and retry are destructive
(``X-API-Key`` when a key is configured) and each writes an audit row
(postbox.app.services.workflows; docs/workflows.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from psycopg import AsyncConnection
from pydantic import BaseModel

from postbox.app.api.errors import responses
from postbox.app.api.params import Cursor, Limit
from postbox.app.api.state import Destructive, db, read_access
from postbox.app.services import workflows as workflow_service
from postbox.app.services.audit import Actor
from postbox.app.services.checks import MAX_BIGINT
from postbox.app.services.results import as_dict

router = APIRouter(prefix="/workflows", tags=["workflows"], dependencies=[Depends(read_access)])

WorkflowId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="The workflow's id.")]
StatusFilter = Annotated[
    str | None, Query(pattern="^(" + "|".join(workflow_service.STATUSES) + ")$", description="Computed status.")
]
NameFilter = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


class WorkflowOut(BaseModel):
    id: int
    name: str
    status: str
    on_failure: str
    jobs: int
    counts: dict[str, int]
    created_at: datetime
    finished_at: datetime | None
    cancelled_at: datetime | None
    retried_at: datetime | None


class WorkflowPage(BaseModel):
    items: list[WorkflowOut]
    next_cursor: str | None


class WorkflowJobOut(BaseModel):
    id: int
    task: str
    queue: str
    state: str
    attempts: int
    max_attempts: int
    waiting_on: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    released_at: datetime | None
    last_error_class: str | None
    last_error: str | None


class WorkflowEdgeOut(BaseModel):
    parent: int
    child: int
    on_failure: str
    failure: dict[str, Any] | None


class WorkflowDetailOut(BaseModel):
    workflow: WorkflowOut
    jobs: list[WorkflowJobOut]
    edges: list[WorkflowEdgeOut]


class WorkflowChangeOut(BaseModel):
    workflow: WorkflowOut
    cancelled: list[int]
    stopping: list[int]
    retried: list[int]


@router.get("", response_model=WorkflowPage, summary="Workflows, newest first", responses=responses(400, 401, 422))
async def list_workflows(
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    status: StatusFilter = None,
    name: NameFilter = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> dict[str, Any]:
    return as_dict(await workflow_service.list_workflows(conn, status=status, name=name, limit=limit, cursor=cursor))


@router.get(
    "/{workflow_id}",
    response_model=WorkflowDetailOut,
    summary="One workflow: its jobs, their states and its edges",
    responses=responses(401, 404, 422),
)
async def get_workflow(workflow_id: WorkflowId, conn: Annotated[AsyncConnection[Any], Depends(db)]) -> dict[str, Any]:
    return as_dict(await workflow_service.get_workflow(conn, workflow_id))


@router.post(
    "/{workflow_id}/cancel",
    response_model=WorkflowChangeOut,
    summary="Cancel every job not started; ask the running ones to stop",
    responses=responses(401, 404, 409, 422),
)
async def cancel_workflow(
    workflow_id: WorkflowId, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await workflow_service.cancel_workflow(conn, workflow_id, actor))


@router.post(
    "/{workflow_id}/retry",
    response_model=WorkflowChangeOut,
    summary="Run its dead, cancelled and expired jobs again, and resume",
    responses=responses(401, 404, 409, 422),
)
async def retry_workflow(
    workflow_id: WorkflowId, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await workflow_service.retry_workflow(conn, workflow_id, actor))
