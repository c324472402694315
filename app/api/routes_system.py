"""Root endpoints: ``/health``, ``/ready``, ``/metrics`` and ``WS /ws/events``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import APIRouter, Query, Request, Response, WebSocket
from starlette.websockets import WebSocketDisconnect

from postbox import definitions, revision
from postbox.app.api.errors import error_response, responses
from postbox.app.api.events_hub import ClientBuffer
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.schemas import Health, Ready
from postbox.app.api.state import (
    SCOPE_SESSION,
    ApiState,
    api_state,
    auth_failed,
    client_address,
    key_failed,
    key_matches,
    throttled,
)
from postbox.app.services import limits as limit_service
from postbox.app.services import queues as queue_service
from postbox.app.services import workers as worker_service
from postbox.app.services import workflows as workflow_service
from postbox.app.services.results import as_dict

log = logging.getLogger(__name__)
router = APIRouter(tags=["system"], route_class=StrictJsonRoute)
CHECK_TIMEOUT = 2.0
WS_OVERFLOW = 1013  # "try again later": the client fell more than the buffer behind
WS_TRY_LATER = 1013  # the same code: a client out of key tries (postbox.app.api.throttle)


@router.get("/health", response_model=Health, summary="The process is alive")
async def health() -> dict[str, str]:
    return {"status": "ok"}


async def _check_postgres(st: ApiState) -> tuple[str, str]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT), st.pool.connection(timeout=CHECK_TIMEOUT) as conn:
            version = await revision.current(conn)
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}", "unknown"
    return "ok", migrations_check(version, st.head_revision)


def migrations_check(version: str | None, head: str) -> str:
    """``ok`` at ``head``, else what is wrong and, when migrating fixes it, that ``postbox migrate`` does."""
    if version is None:
        return "no postbox schema: run `postbox migrate`"
    if version == head:
        return "ok"
    place, needed = revision.order(version), revision.order(head)
    if place is not None and needed is not None and place < needed:
        return f"at {version}, head is {head}: run `postbox migrate`"
    return f"at {version}, head is {head}"


async def _check_redis(st: ApiState) -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            await st.redis.ping()
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


@router.get(
    "/ready",
    response_model=Ready,
    summary="PostgreSQL and Redis reachable, migrations at head",
    responses=responses(503),
)
async def ready(request: Request) -> Any:
    st = api_state(request)
    (postgres, migrations), redis = await asyncio.gather(_check_postgres(st), _check_redis(st))
    checks = {"postgresql": postgres, "redis": redis, "migrations": migrations}
    failing = [name for name, value in checks.items() if value not in ("ok", "unknown")]
    if failing:
        return error_response(
            503,
            "NOT_READY",
            "not ready: " + ", ".join(f"{name} {checks[name]}" for name in failing),
            {"failing": failing, "checks": checks},
        )
    return {"status": "ready", "checks": checks}


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Exposition text."}},
)
async def metrics(request: Request) -> Response:
    st = api_state(request)
    collector = st.metrics.queues
    try:
        async with asyncio.timeout(CHECK_TIMEOUT * 2), st.pool.connection(timeout=CHECK_TIMEOUT) as conn:
            stats = await queue_service.queue_stats(
                conn, st.redis, st.settings.redis_prefix, extra_queues=await definitions.known_queues(conn, st.registry)
            )
            collector.queues = [as_dict(q) for q in stats]
            found = await worker_service.list_workers(conn, heartbeat_interval=st.settings.heartbeat_interval)
            try:  # the workflow gauges (docs/workflows.md); their failure leaves the others
                st.metrics.workflows.active, st.metrics.workflows.waiting = await workflow_service.gauges(conn)
            except Exception as exc:
                log.warning("workflow gauges unavailable: %s", type(exc).__name__)
                st.metrics.workflows.active = None
                await conn.rollback()
            try:  # the flow-control gauges (GET /api/v1/limits); their failure leaves the queue gauges
                st.metrics.limits.limits = limit_service.gauges(await limit_service.list_limits(conn))
            except Exception as exc:
                log.warning("limit gauges unavailable: %s", type(exc).__name__)
                st.metrics.limits.limits = ()
                await conn.rollback()
        collector.workers = {
            "live": sum(1 for w in found if not w.stale and not w.stopped),
            "stale": sum(1 for w in found if w.stale),
            "stopped": sum(1 for w in found if w.stopped),
        }
    except Exception as exc:  # serve the request counters even when a store is down
        log.warning("queue gauges unavailable: %s", type(exc).__name__)
        collector.queues, collector.workers = (), {}
        st.metrics.limits.limits = ()
    return Response(st.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.websocket("/ws/events")
async def events(
    websocket: WebSocket,
    job_id: int | None = Query(default=None),
    queue: str | None = Query(default=None),
    workflow_id: int | None = Query(default=None),
) -> None:
    """Job lifecycle events as JSON text frames; optional filters ``job_id``, ``queue`` and ``workflow_id``."""
    st: ApiState = websocket.app.state.postbox
    settings = st.settings
    given = websocket.headers.get("x-api-key") or websocket.query_params.get("api_key")
    client = client_address(websocket.client)
    if settings.api_key and given is not None:
        if throttled(st, client, "websocket") is not None:
            await websocket.close(code=WS_TRY_LATER, reason="too many wrong keys from this address")
            return
        if not key_matches(given, settings.api_key):
            await key_failed(st, "websocket", "WEBSOCKET", websocket.url.path, client, None)
            await websocket.close(code=1008, reason="missing or invalid API key")
            return
    elif settings.api_key_for_all and websocket.scope.get(SCOPE_SESSION) is None:
        auth_failed(st, "missing", "WEBSOCKET", websocket.url.path, client, None)
        await websocket.close(code=1008, reason="missing or invalid API key")
        return
    # As GET /api/v1/jobs/{id}: a handler's progress note only to a reader allowed job contents.
    keyed = bool(settings.api_key) and (given is not None or websocket.scope.get(SCOPE_SESSION) is not None)
    contents = keyed or settings.api_public_args or (settings.api_key is None and settings.api_insecure)

    def accept(evt: dict[str, Any]) -> bool:
        return (
            (job_id is None or evt.get("job_id") == job_id)
            and (queue is None or evt.get("queue") == queue)
            and (workflow_id is None or evt.get("workflow_id") == workflow_id)
        )

    buffer = ClientBuffer(accept=accept)
    try:
        await st.hub.add(buffer)
    except TimeoutError:
        await websocket.close(code=1011, reason="event source (Redis) unavailable")
        return
    await websocket.accept()
    receiver = asyncio.create_task(_drain_incoming(websocket))
    try:
        while True:
            getter = asyncio.ensure_future(buffer.next())
            done, _ = await asyncio.wait({getter, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if receiver in done:
                getter.cancel()
                break
            evt = getter.result()
            if evt is None:
                await websocket.close(code=WS_OVERFLOW, reason="client too slow: event buffer overflowed")
                break
            await websocket.send_json(evt if contents else _without_note(evt))
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        st.hub.remove(buffer)
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await receiver


def _without_note(evt: dict[str, Any]) -> dict[str, Any]:
    """A ``progress`` event with its note withheld (the numbers are not sensitive; the note may be)."""
    progress = evt.get("progress")
    if isinstance(progress, dict) and progress.get("note") is not None:
        return {**evt, "progress": {**progress, "note": None}}
    return evt


async def _drain_incoming(websocket: WebSocket) -> None:
    """Returns when the client disconnects (incoming messages are ignored)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
