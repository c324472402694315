"""``/api/v1/workflows``: workflows — list (by status, name), get (jobs, states, edges), cancel, retry.

Reads are open like the other reads; cancel and retry are destructive
(``X-API-Key`` when a key is configured) and each writes an audit row
(postbox.app.services.workflows; docs/workflows.md).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from psycopg import AsyncConnection

from postbox.app.api.errors import responses
from postbox.app.api.params import Cursor, Limit
from postbox.app.api.shapes import response_model
from postbox.app.api.state import Destructive, db, read_access
from postbox.app.services import workflows as workflow_service
from postbox.app.services.audit import Actor
from postbox.app.services.checks import MAX_BIGINT
from postbox.app.services.results import Page, as_dict
from postbox.app.services.results import T as Item

router = APIRouter(prefix="/workflows", tags=["workflows"], dependencies=[Depends(read_access)])

WorkflowId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="The workflow's id.")]
StatusFilter = Annotated[
    str | None, Query(pattern="^(" + "|".join(workflow_service.STATUSES) + ")$", description="Computed status.")
]
NameFilter = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


WorkflowOut = response_model(workflow_service.WorkflowSummary, "WorkflowOut")
WorkflowPage = response_model(Page, "WorkflowPage", nested={Item: WorkflowOut})
WorkflowJobOut = response_model(workflow_service.WorkflowJob, "WorkflowJobOut")
WorkflowEdgeOut = response_model(workflow_service.WorkflowEdge, "WorkflowEdgeOut")
NESTED = {
    workflow_service.WorkflowSummary: WorkflowOut,
    workflow_service.WorkflowJob: WorkflowJobOut,
    workflow_service.WorkflowEdge: WorkflowEdgeOut,
}
WorkflowDetailOut = response_model(workflow_service.WorkflowDetail, "WorkflowDetailOut", nested=NESTED)
WorkflowChangeOut = response_model(workflow_service.WorkflowChange, "WorkflowChangeOut", nested=NESTED)


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
