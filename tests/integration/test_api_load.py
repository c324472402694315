"""Load shedding: a bounded number of requests in flight, a bounded pool wait, an exact queue depth."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any

import psycopg
import pytest
from fastapi import APIRouter, Depends
from fastapi.testclient import TestClient
from psycopg import AsyncConnection

from postbox.app.api.main import create_app
from postbox.app.api.state import db
from postbox.app.services import jobs as job_service
from postbox.errors import QueueFullError
from postbox.producer import Limits
from postbox.registry import default_registry
from postbox.settings import Settings
from tests.harness.wait import wait_until, wait_until_async


def _holding_router(entered: threading.Event, release: threading.Event) -> APIRouter:
    router = APIRouter()

    @router.get("/hold")
    async def hold(conn: Annotated[AsyncConnection[Any], Depends(db)]) -> dict[str, bool]:
        entered.set()  # holds a pooled connection until released
        await asyncio.to_thread(release.wait, 30)
        return {"held": True}

    return router


def test_over_the_in_flight_limit_the_api_answers_503_at_once(settings: Settings) -> None:
    both_in, release = threading.Event(), threading.Event()
    entered: list[int] = []
    slow = APIRouter()

    @slow.get("/slow")
    async def slow_route() -> dict[str, bool]:
        entered.append(1)
        if len(entered) == 2:
            both_in.set()
        await asyncio.to_thread(release.wait, 30)
        return {"ok": True}

    app = create_app(settings.model_copy(update={"api_max_in_flight": 2}), registry=default_registry, routers=[slow])
    with TestClient(app, raise_server_exceptions=False) as client:
        codes: list[int] = []
        held = [threading.Thread(target=lambda: codes.append(client.get("/api/v1/slow").status_code)) for _ in range(2)]
        for t in held:
            t.start()
        try:
            assert both_in.wait(10)
            started = time.monotonic()
            shed = client.get("/api/v1/slow")
            took = time.monotonic() - started
            health = client.get("/health")
        finally:
            release.set()
            for t in held:
                t.join(10)
        assert shed.status_code == 503
        assert shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["code"] == "OVERLOADED"
        assert shed.json()["error"]["details"] == {"in_flight_limit": 2}
        assert took < 5.0  # answered at once, not queued behind the two held requests (held until release)
        assert health.status_code == 200  # probes are never shed
        assert codes == [200, 200]
        assert client.get("/api/v1/slow").status_code == 200  # the slots are free again
        metrics = client.get("/metrics").text
    assert 'postbox_api_requests_total{method="GET",route="unmatched",status="503"} 1.0' in metrics


def test_a_request_that_waits_too_long_for_a_connection_is_a_503(settings: Settings) -> None:
    entered, release = threading.Event(), threading.Event()
    overrides = {"api_pool_size": 1, "api_pool_timeout": 0.3, "api_insecure": True}
    app = create_app(
        settings.model_copy(update=overrides), registry=default_registry, routers=[_holding_router(entered, release)]
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        holder = threading.Thread(target=client.get, args=("/api/v1/hold",))
        holder.start()
        try:
            assert entered.wait(10)
            started = time.monotonic()
            r = client.get("/api/v1/jobs")
            took = time.monotonic() - started
        finally:
            release.set()
            holder.join(10)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "OVERLOADED"
        assert 0.25 <= took < 8.0  # the pool wait (0.3 s), then the 503; generous for a busy machine
        assert client.get("/api/v1/jobs").status_code == 200


@pytest.fixture
def limit_row() -> Iterator[Any]:
    import tests.harness.tasks.api  # noqa: F401  (registers api_echo)

    # What the enqueues below take: the task (its default queue, apiq), its args, the registry, the limits.
    yield {"task": "api_echo", "args": {}, "registry": default_registry, "limits": Limits()}


async def test_max_queue_depth_is_exact_under_concurrent_enqueues(
    database_url: str, conn: psycopg.Connection[Any], limit_row: Any
) -> None:
    """B enqueues while A, which takes the last free place, has not committed: B must wait for A, then be refused."""
    limit = 3
    for _ in range(limit - 1):
        await_row = conn.execute(
            "INSERT INTO postbox.outbox (queue, task, args) VALUES ('apiq', 'api_echo', '{}') RETURNING id"
        ).fetchone()
        assert await_row is not None
    conn.commit()
    async with (
        await AsyncConnection.connect(database_url, autocommit=True) as a,
        await AsyncConnection.connect(database_url, autocommit=True) as b,
    ):
        b_pid = b.info.backend_pid
        outcome: dict[str, Any] = {}

        async def enqueue_b() -> None:
            try:
                outcome["b"] = await job_service.enqueue(b, **limit_row, max_queue_depth=limit)
            except QueueFullError as exc:
                outcome["b"] = exc

        def b_done_or_waiting() -> bool:
            if "b" in outcome:
                return True
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND NOT granted", (b_pid,)
            ).fetchone()
            conn.commit()
            return bool(row and row[0])

        async def before_commit(job: job_service.Job) -> None:  # A holds its place, uncommitted, while B tries
            outcome["b_task"] = asyncio.create_task(enqueue_b())
            await wait_until_async(b_done_or_waiting, 30, message="B finished or waiting on A's advisory lock")

        done = await job_service.enqueue(a, **limit_row, max_queue_depth=limit, before_commit=before_commit)
        assert not done.duplicate and done.job.queue == "apiq"
        await asyncio.wait_for(outcome["b_task"], timeout=20)
    assert isinstance(outcome["b"], QueueFullError), outcome["b"]
    waiting = conn.execute("SELECT count(*) FROM postbox.outbox WHERE queue = 'apiq'").fetchone()
    assert waiting == (limit,)


def test_sixty_concurrent_enqueues_never_overshoot_the_depth(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    with TestClient(
        create_app(settings.model_copy(update={"max_queue_depth": 50, "api_pool_size": 20}), registry=default_registry),
        raise_server_exceptions=False,
    ) as client:
        codes: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: codes.append(client.post("/api/v1/jobs", json={"task": "api_echo"}).status_code)
            )
            for _ in range(60)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    wait_until(lambda: len(codes) == 60)
    assert sorted(set(codes)) == [201, 429]
    assert codes.count(201) == 50
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (50,)
