"""``/api/v1/queues`` and ``/api/v1/workers``: stats, pause/resume, the heartbeat registry."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from psycopg import AsyncConnection

from postbox import control, limit_control
from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.schemas import QUEUE_PATTERN, AuditPage, QueueState, QueueStats, Worker
from postbox.app.api.state import Destructive, api_state, db, read_access
from postbox.control import Actor

queues = APIRouter(prefix="/queues", tags=["queues"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute)
workers = APIRouter(
    prefix="/workers", tags=["workers"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute
)
audit = APIRouter(prefix="/audit", tags=["audit"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute)

QueueName = Annotated[str, Path(pattern=QUEUE_PATTERN, description="Queue name.")]
WorkerId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


@queues.get("", response_model=list[QueueStats], summary="Stats of every known queue", responses=responses(401))
async def list_queues(request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)]) -> list[dict[str, Any]]:
    st = api_state(request)
    stats = await control.queue_stats(conn, st.redis, st.settings.redis_prefix, extra_queues=st.registry.queues())
    return await _with_limits(conn, stats)


@queues.get("/{queue}", response_model=QueueStats, summary="Stats of one queue", responses=responses(401, 404, 422))
async def get_queue(
    queue: QueueName, request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)]
) -> dict[str, Any]:
    st = api_state(request)
    found = await control.queue_stats(
        conn, st.redis, st.settings.redis_prefix, queue=queue, extra_queues=st.registry.queues()
    )
    return (await _with_limits(conn, found))[0]


async def _with_limits(conn: AsyncConnection[Any], stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each queue's stats with its flow-control limits: its own, then its tasks' (limit_control)."""
    grouped = await limit_control.queue_limits(conn)
    for item in stats:
        item["limits"] = grouped.get(item["queue"], [])
    return stats


@queues.post("/{queue}/pause", response_model=QueueState, summary="Pause a queue", responses=responses(401, 403, 422))
async def pause(
    queue: QueueName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return await control.set_paused(conn, queue, True, actor)


@queues.post("/{queue}/resume", response_model=QueueState, summary="Resume a queue", responses=responses(401, 403, 422))
async def resume(
    queue: QueueName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return await control.set_paused(conn, queue, False, actor)


@workers.get("", response_model=list[Worker], summary="Registered workers", responses=responses(401))
async def list_workers(request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)]) -> list[dict[str, Any]]:
    return await control.list_workers(conn, heartbeat_interval=api_state(request).settings.heartbeat_interval)


@workers.get("/{worker_id}", response_model=Worker, summary="One worker", responses=responses(401, 404, 422))
async def get_worker(
    worker_id: WorkerId, request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)]
) -> dict[str, Any]:
    return await control.get_worker(conn, worker_id, heartbeat_interval=api_state(request).settings.heartbeat_interval)


@audit.get("", response_model=AuditPage, summary="The audit log, newest first", responses=responses(400, 401, 422))
async def list_audit(
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    limit: Annotated[int, Query(ge=1, le=control.MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    page = await control.list_audit(conn, limit=limit, cursor=cursor)
    return {"items": page.items, "next_cursor": page.next_cursor}
