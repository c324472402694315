"""Stagedoor's producer endpoints: create events, place orders (mounted under ``/api/v1``).

``POST /orders`` writes the order, its tickets and its two jobs in one
transaction; a refused order answers 4xx with ``{"error": {...}}`` and leaves
nothing behind.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from psycopg import AsyncConnection

from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.settings import load_settings
from postbox_examples.stagedoor.errors import InvalidOrderError, OrderError
from postbox_examples.stagedoor.orders import create_event, get_event, place_order

router = APIRouter(tags=["stagedoor"], route_class=StrictJsonRoute)

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

EVENT_BODY = {
    "type": "object",
    "required": ["name", "capacity"],
    "properties": {"name": {"type": "string", "maxLength": 200}, "capacity": {"type": "integer", "minimum": 0}},
}
ORDER_BODY = {
    "type": "object",
    "required": ["event_id", "seats", "email"],
    "properties": {
        "event_id": {"type": "integer", "minimum": 1},
        "seats": {"type": "integer", "minimum": 1, "maximum": 20},
        "email": {"type": "string", "format": "email"},
    },
}


async def connection(request: Request) -> AsyncIterator[AsyncConnection[Any]]:
    """The API app's pooled connection when it has one (``app.state.postbox.pool``), else a fresh one."""
    pool = getattr(getattr(request.app.state, "postbox", None), "pool", None)
    if pool is not None:
        async with pool.connection() as conn:
            yield conn
        return
    conn = await AsyncConnection.connect(load_settings().require_database_url(), autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


def _request_id(request: Request) -> str:
    given = getattr(request.state, "request_id", None) or request.headers.get("x-request-id", "")
    return given if REQUEST_ID_RE.match(given) else uuid.uuid4().hex


def _refused(exc: OrderError) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": exc.code, "message": str(exc), "details": exc.details}}, status_code=exc.status
    )


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidOrderError("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidOrderError("the body must be a JSON object")
    return body


def _event_json(event: Any) -> dict[str, Any]:
    return {
        "id": event.id,
        "name": event.name,
        "capacity": event.capacity,
        "seats_reserved": event.seats_reserved,
        "seats_sold": event.seats_sold,
        "created_at": event.created_at.isoformat(),
    }


@router.post(
    "/events",
    status_code=201,
    summary="Create an event",
    responses=responses(401, 422),
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": EVENT_BODY}}}},
)
async def post_event(request: Request, conn: AsyncConnection[Any] = Depends(connection)) -> JSONResponse:
    try:
        body = await _json_object(request)
        event = await create_event(conn, body.get("name"), body.get("capacity"))
    except OrderError as exc:
        return _refused(exc)
    return JSONResponse(_event_json(event), status_code=201)


@router.get("/events/{event_id}", summary="An event with its seats reserved and sold", responses=responses(401, 404))
async def get_event_route(event_id: int, conn: AsyncConnection[Any] = Depends(connection)) -> JSONResponse:
    event = await get_event(conn, event_id)
    if event is None:
        return JSONResponse(
            {"error": {"code": "UNKNOWN_EVENT", "message": f"no event {event_id}", "details": {"event_id": event_id}}},
            status_code=404,
        )
    return JSONResponse(_event_json(event))


@router.post(
    "/orders",
    status_code=201,
    summary="Place an order: the order, its tickets and its jobs in one transaction",
    responses=responses(401, 404, 409, 422),
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": ORDER_BODY}}}},
)
async def post_order(request: Request, conn: AsyncConnection[Any] = Depends(connection)) -> JSONResponse:
    request_id = _request_id(request)
    try:
        body = await _json_object(request)
        order = await place_order(
            conn, body.get("event_id"), body.get("seats"), body.get("email"), request_id=request_id
        )
    except OrderError as exc:
        return _refused(exc)
    return JSONResponse(
        {
            "id": order.id,
            "public_id": order.public_id,
            "event_id": order.event_id,
            "seats": order.seats,
            "email": order.email,
            "seat_numbers": order.seat_numbers,
            "job_ids": order.job_ids,
            "request_id": request_id,
            "created_at": order.created_at.isoformat(),
        },
        status_code=201,
        headers={"X-Request-ID": request_id},
    )
