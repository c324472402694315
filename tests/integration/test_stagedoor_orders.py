"""Placing Stagedoor orders: one transaction for the order, its tickets and its jobs; refusals leave nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from psycopg import AsyncConnection

from postbox_examples.stagedoor.cli import create_demo_app
from postbox_examples.stagedoor.errors import (
    InvalidEmailError,
    InvalidOrderError,
    NotEnoughSeatsError,
    UnknownEventError,
)
from postbox_examples.stagedoor.orders import create_event, place_order
from postbox_examples.stagedoor.routes import connection, router
from tests.harness.api import make_client


async def counts(conn: AsyncConnection[Any]) -> dict[str, int]:
    out = {}
    for table in ("stagedoor.orders", "stagedoor.tickets", "postbox.outbox", "stagedoor.email_sends"):
        cur = await conn.execute(f"SELECT count(*) FROM {table}")  # type: ignore[arg-type]
        row = await cur.fetchone()
        out[table.split(".")[1]] = int(row[0]) if row else -1
    return out


async def test_order_writes_order_tickets_and_two_jobs(aconn: AsyncConnection[Any]) -> None:
    event = await create_event(aconn, "Hamlet", 10)
    await create_event(aconn, "Other", 5)
    first = await place_order(aconn, event.id, 3, "ann@example.org", request_id="req-1")
    second = await place_order(aconn, event.id, 2, "bob@example.org")
    assert first.seat_numbers == [1, 2, 3]
    assert second.seat_numbers == [4, 5]
    assert first.public_id.startswith("SD-") and len(first.public_id) == 13
    cur = await aconn.execute("SELECT id, task, args, headers, state FROM postbox.outbox ORDER BY id")
    jobs = await cur.fetchall()
    assert [(j[0], j[1], j[2], j[4]) for j in jobs] == [
        (first.job_ids[0], "render_tickets", {"order_id": first.id}, "pending"),
        (first.job_ids[1], "update_sales_counter", {"order_id": first.id}, "pending"),
        (second.job_ids[0], "render_tickets", {"order_id": second.id}, "pending"),
        (second.job_ids[1], "update_sales_counter", {"order_id": second.id}, "pending"),
    ]
    assert jobs[0][3] == {"request_id": "req-1"} and jobs[1][3] == {"request_id": "req-1"}
    assert jobs[2][3] == {}
    cur = await aconn.execute("SELECT order_id, seat, pdf_key FROM stagedoor.tickets ORDER BY seat")
    assert await cur.fetchall() == [(first.id, s, None) for s in (1, 2, 3)] + [(second.id, s, None) for s in (4, 5)]
    cur = await aconn.execute("SELECT seats_reserved, seats_sold FROM stagedoor.events WHERE id = %s", (event.id,))
    assert await cur.fetchone() == (5, 0)


@pytest.mark.parametrize(
    ("event_id", "seats", "email", "error"),
    [
        (999_999, 1, "a@example.org", UnknownEventError),
        (None, 3, "a@example.org", NotEnoughSeatsError),  # None: the real event (capacity 2)
        (None, 1, "not-an-email", InvalidEmailError),
        (None, 0, "a@example.org", InvalidOrderError),
        (None, 21, "a@example.org", InvalidOrderError),
        (None, True, "a@example.org", InvalidOrderError),
        ("1", 1, "a@example.org", InvalidOrderError),
    ],
)
async def test_refused_order_leaves_nothing(
    aconn: AsyncConnection[Any], event_id: Any, seats: Any, email: Any, error: type[Exception]
) -> None:
    event = await create_event(aconn, "Small room", 2)
    before = await counts(aconn)
    with pytest.raises(error):
        await place_order(aconn, event.id if event_id is None else event_id, seats, email)
    assert await counts(aconn) == before == {"orders": 0, "tickets": 0, "outbox": 0, "email_sends": 0}
    cur = await aconn.execute("SELECT seats_reserved FROM stagedoor.events WHERE id = %s", (event.id,))
    assert await cur.fetchone() == (0,)


async def test_refusal_inside_callers_transaction_rolls_back_only_the_order(aconn: AsyncConnection[Any]) -> None:
    event = await create_event(aconn, "Room", 1)
    async with aconn.transaction():
        await place_order(aconn, event.id, 1, "a@example.org")
        with pytest.raises(NotEnoughSeatsError):
            await place_order(aconn, event.id, 1, "b@example.org")
    assert await counts(aconn) == {"orders": 1, "tickets": 1, "outbox": 2, "email_sends": 0}


async def test_concurrent_orders_never_oversell(database_url: str, aconn: AsyncConnection[Any]) -> None:
    event = await create_event(aconn, "Last seats", 7)

    async def buy() -> str:
        async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
            try:
                await place_order(conn, event.id, 2, "fan@example.org")
                return "ok"
            except NotEnoughSeatsError:
                return "refused"

    results = await asyncio.gather(*(buy() for _ in range(10)))
    assert sorted(results).count("ok") == 3
    cur = await aconn.execute("SELECT seats_reserved FROM stagedoor.events WHERE id = %s", (event.id,))
    assert await cur.fetchone() == (6,)
    assert await counts(aconn) == {"orders": 3, "tickets": 6, "outbox": 3 * 2, "email_sends": 0}
    cur = await aconn.execute("SELECT count(DISTINCT seat) FROM stagedoor.tickets")
    assert await cur.fetchone() == (6,)


# --- the HTTP endpoints --------------------------------------------------------------


@pytest.fixture
async def api(database_url: str) -> Any:
    app = FastAPI()
    app.include_router(router, prefix="/api/v1")

    async def test_connection() -> Any:
        async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
            yield conn

    app.dependency_overrides[connection] = test_connection
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client


async def test_api_event_and_order(api: httpx.AsyncClient, aconn: AsyncConnection[Any]) -> None:
    created = await api.post("/api/v1/events", json={"name": "Gala", "capacity": 4})
    assert created.status_code == 201
    event = created.json()
    assert event["name"] == "Gala" and event["capacity"] == 4 and event["seats_sold"] == 0
    placed = await api.post(
        "/api/v1/orders",
        json={"event_id": event["id"], "seats": 2, "email": "c@example.org"},
        headers={"X-Request-ID": "abc-123"},
    )
    assert placed.status_code == 201, placed.text
    body = placed.json()
    assert body["public_id"].startswith("SD-") and len(body["job_ids"]) == 2
    cur = await aconn.execute("SELECT id, headers - 'traceparent' - 'tracestate' FROM postbox.outbox ORDER BY id")
    # (with OpenTelemetry configured in the process, FastAPI's request span is the jobs' trace context too)
    assert await cur.fetchall() == [(job_id, {"request_id": "abc-123"}) for job_id in body["job_ids"]]
    shown = await api.get(f"/api/v1/events/{event['id']}")
    assert shown.json()["seats_reserved"] == 2


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"event_id": 424242, "seats": 1, "email": "a@example.org"}, 404, "UNKNOWN_EVENT"),
        ({"event_id": "EVENT", "seats": 5, "email": "a@example.org"}, 409, "NOT_ENOUGH_SEATS"),
        ({"event_id": "EVENT", "seats": 1, "email": "nope"}, 422, "INVALID_EMAIL"),
        ({"event_id": "EVENT", "seats": "2", "email": "a@example.org"}, 422, "INVALID_ORDER"),
        ({"event_id": "EVENT"}, 422, "INVALID_ORDER"),
        (["not", "an", "object"], 422, "INVALID_ORDER"),
    ],
)
async def test_api_refused_order(
    api: httpx.AsyncClient, aconn: AsyncConnection[Any], body: Any, status: int, code: str
) -> None:
    event = (await api.post("/api/v1/events", json={"name": "Tiny", "capacity": 3})).json()
    if isinstance(body, dict) and body.get("event_id") == "EVENT":
        body = {**body, "event_id": event["id"]}
    response = await api.post(
        "/api/v1/orders", content=orjson.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and isinstance(error["details"], dict)
    assert await counts(aconn) == {"orders": 0, "tickets": 0, "outbox": 0, "email_sends": 0}


async def test_api_refuses_bad_event(api: httpx.AsyncClient, aconn: AsyncConnection[Any]) -> None:
    for body in ({"name": "", "capacity": 3}, {"name": "x", "capacity": -1}, {"name": "x"}):
        response = await api.post("/api/v1/events", json=body)
        assert response.status_code == 422 and response.json()["error"]["code"] == "INVALID_ORDER"
    bad_json = await api.post("/api/v1/events", content=b"{", headers={"content-type": "application/json"})
    assert bad_json.status_code == 422
    cur = await aconn.execute("SELECT count(*) FROM stagedoor.events")
    assert await cur.fetchone() == (0,)


def test_postbox_api_serves_no_example_routes(settings: Any) -> None:
    """`postbox api run` is postbox's operations surface only: the demo's routes are not there."""
    with make_client(settings) as client:
        order = {"event_id": 1, "seats": 1, "email": "a@example.org"}
        assert client.post("/api/v1/orders", json=order).status_code == 404
        assert client.post("/api/v1/events", json={"name": "x", "capacity": 1}).status_code == 404
        paths = client.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith(("/api/v1/orders", "/api/v1/events"))]
    assert "/api/v1/jobs" in paths


def test_routes_in_the_real_api_app(settings: Any, conn: Any) -> None:
    """Through the demo's API app (create_app with its router: the pool, request ids, the error shape)."""
    with TestClient(create_demo_app(settings), raise_server_exceptions=False) as client:
        event = client.post("/api/v1/events", json={"name": "Real app", "capacity": 2}).json()
        placed = client.post(
            "/api/v1/orders",
            json={"event_id": event["id"], "seats": 2, "email": "d@example.org"},
            headers={"X-Request-ID": "real-app-1"},
        )
        refused = client.post("/api/v1/orders", json={"event_id": event["id"], "seats": 1, "email": "e@example.org"})
        documented = client.get("/openapi.json").json()["paths"]["/api/v1/orders"]["post"]["responses"]
    assert placed.status_code == 201 and placed.headers["X-Request-ID"] == "real-app-1"
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "NOT_ENOUGH_SEATS"
    assert {"201", "404", "409", "422"} <= set(documented)
    rows = conn.execute("SELECT task, headers->>'request_id' FROM postbox.outbox ORDER BY id").fetchall()
    assert rows == [("render_tickets", "real-app-1"), ("update_sales_counter", "real-app-1")]
    assert conn.execute("SELECT count(*) FROM stagedoor.orders").fetchone() == (1,)
