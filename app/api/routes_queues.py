"""``/api/v1/queues`` and ``/api/v1/workers``: stats, pause/resume, the heartbeat registry."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from psycopg import AsyncConnection

from postbox import definitions
from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.schemas import (
    QUEUE_PATTERN,
    AuditPage,
    FairnessCleared,
    FairnessDeclaration,
    QueueFairness,
    QueueState,
    QueueStats,
    Worker,
)
from postbox.app.api.state import (
    Destructive,
    Processes,
    api_state,
    db,
    read_access,
    redacted_process,
    require_key_for_sensitive,
)
from postbox.app.services import audit as audit_service
from postbox.app.services import fairness as fairness_service
from postbox.app.services import limits as limit_service
from postbox.app.services import queues as queue_service
from postbox.app.services import workers as worker_service
from postbox.app.services.audit import Actor
from postbox.app.services.checks import MAX_PAGE
from postbox.app.services.queues import QueueStats as QueueStatsResult
from postbox.app.services.results import as_dict

queues = APIRouter(prefix="/queues", tags=["queues"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute)
workers = APIRouter(
    prefix="/workers", tags=["workers"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute
)
audit = APIRouter(  # who did what, and from which address: the key's (postbox.app.api.state)
    prefix="/audit", tags=["audit"], dependencies=[Depends(require_key_for_sensitive)], route_class=StrictJsonRoute
)

QueueName = Annotated[str, Path(pattern=QUEUE_PATTERN, description="Queue name.")]
WorkerId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


@queues.get("", response_model=list[QueueStats], summary="Stats of every known queue", responses=responses(401))
async def list_queues(request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)]) -> list[dict[str, Any]]:
    st = api_state(request)
    known = await definitions.known_queues(conn, st.registry)
    stats = await queue_service.queue_stats(conn, st.redis, st.settings.redis_prefix, extra_queues=known)
    return await _with_limits(conn, stats, st.settings.fair_window)


@queues.get("/{queue}", response_model=QueueStats, summary="Stats of one queue", responses=responses(401, 404, 422))
async def get_queue(
    queue: QueueName, request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)]
) -> dict[str, Any]:
    st = api_state(request)
    found = await queue_service.queue_stats(
        conn,
        st.redis,
        st.settings.redis_prefix,
        queue=queue,
        extra_queues=await definitions.known_queues(conn, st.registry),
    )
    return (await _with_limits(conn, found, st.settings.fair_window))[0]


async def _with_limits(
    conn: AsyncConnection[Any], stats: list[QueueStatsResult], default_window: int
) -> list[dict[str, Any]]:
    """Each queue's stats with its flow-control limits (its own, then its tasks') and its fairness, if fair."""
    grouped = await limit_service.queue_limits(conn)
    fair = await fairness_service.by_queue(conn, default_window=default_window)
    return [
        {
            **as_dict(item),
            "limits": [as_dict(x) for x in grouped.get(item.queue, [])],
            "fair": as_dict(fair[item.queue]) if item.queue in fair else None,
        }
        for item in stats
    ]


@queues.post("/{queue}/pause", response_model=QueueState, summary="Pause a queue", responses=responses(401, 403, 422))
async def pause(
    queue: QueueName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await queue_service.set_paused(conn, queue, True, actor))


@queues.post("/{queue}/resume", response_model=QueueState, summary="Resume a queue", responses=responses(401, 403, 422))
async def resume(
    queue: QueueName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return as_dict(await queue_service.set_paused(conn, queue, False, actor))


@queues.get(
    "/{queue}/fairness",
    response_model=QueueFairness,
    summary="A fair queue's window and its keys with the most jobs waiting",
    responses=responses(401, 404, 422),
)
async def get_fairness(
    queue: QueueName,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    keys: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    window = api_state(request).settings.fair_window
    return as_dict(await fairness_service.get(conn, queue, default_window=window, keys=keys))


@queues.put(
    "/{queue}/fairness",
    response_model=QueueFairness,
    summary="Serve a queue's jobs by an argument's values in turn",
    responses=responses(401, 403, 422),
)
async def put_fairness(
    queue: QueueName,
    body: FairnessDeclaration,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
) -> dict[str, Any]:
    window = api_state(request).settings.fair_window
    return as_dict(await fairness_service.declare(conn, queue, body.by, body.window, actor, default_window=window))


@queues.delete(
    "/{queue}/fairness",
    response_model=FairnessCleared,
    summary="Serve a queue in enqueue order again",
    responses=responses(401, 403, 422),
)
async def delete_fairness(
    queue: QueueName, conn: Annotated[AsyncConnection[Any], Depends(db)], actor: Actor = Destructive
) -> dict[str, Any]:
    return {"queue": queue, "was_fair": await fairness_service.clear(conn, queue, actor)}


@workers.get("", response_model=list[Worker], summary="Registered workers", responses=responses(401))
async def list_workers(
    request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)], hosts: bool = Processes
) -> list[dict[str, Any]]:
    found = await worker_service.list_workers(conn, heartbeat_interval=api_state(request).settings.heartbeat_interval)
    return [redacted_process(as_dict(item), hosts) for item in found]


@workers.get("/{worker_id}", response_model=Worker, summary="One worker", responses=responses(401, 404, 422))
async def get_worker(
    worker_id: WorkerId, request: Request, conn: Annotated[AsyncConnection[Any], Depends(db)], hosts: bool = Processes
) -> dict[str, Any]:
    interval = api_state(request).settings.heartbeat_interval
    found = await worker_service.get_worker(conn, worker_id, heartbeat_interval=interval)
    return redacted_process(as_dict(found), hosts)


@audit.get("", response_model=AuditPage, summary="The audit log, newest first", responses=responses(400, 401, 422))
async def list_audit(
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    return as_dict(await audit_service.list_audit(conn, limit=limit, cursor=cursor))
