"""The FastAPI application: ``create_app(settings)``.

Resources (a PostgreSQL pool, Redis clients, the event hub) are built in the
app's lifespan, never at import time. Tasks are loaded from ``POSTBOX_TASKS``
(the same modules the workers load) so enqueues are validated here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from postbox import db, migrate, redis_conn, socket_wait
from postbox.app.api import (
    errors,
    results,
    routes_dlq,
    routes_jobs,
    routes_limits,
    routes_moves,
    routes_queues,
    routes_schedules,
    routes_sessions,
    routes_system,
    routes_workflows,
)
from postbox.app.api.body_guard import BodyGuard
from postbox.app.api.events_hub import EventHub, EventPublisher
from postbox.app.api.json_body import JsonGuard
from postbox.app.api.metrics import ApiMetrics
from postbox.app.api.observer import Observer
from postbox.app.api.shedder import LoopLag, Shedder
from postbox.app.api.state import ApiState, read_access, start_warnings
from postbox.app.api.throttle import AuthThrottle
from postbox.app.dashboard import install as install_dashboard
from postbox.audience import Audience
from postbox.pool import StackPool
from postbox.registry import Registry, default_registry, load_task_modules
from postbox.settings import Settings
from postbox.streams import events_channel

log = logging.getLogger(__name__)
BODY_SLACK = 65_536  # JSON envelope allowed on top of the args limit: the body limit of every route


def create_app(settings: Settings, registry: Registry | None = None, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The API on ``settings``' PostgreSQL and Redis; ``registry`` defaults to the process-wide one.

    It serves postbox's operations surface only. An application adds its own
    endpoints with ``routers`` (mounted under ``/api/v1``, sharing the API's pool
    as ``app.state.postbox.pool``): the Stagedoor demo's API process does.
    """
    database_url = settings.require_database_url()
    settings.require_redis_url()
    if registry is None:
        load_task_modules(settings.tasks)
        registry = default_registry
    task_registry = registry

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool: AsyncConnectionPool[AsyncConnection[Any]] = StackPool(  # the connection returned last first
            database_url,
            connection_class=socket_wait.Connection,  # one epoll registration per session, not per round trip
            min_size=1,
            max_size=settings.api_pool_size,
            open=False,
            timeout=settings.api_pool_timeout,  # bounded: a longer wait is a 503 (errors.py)
            kwargs={"application_name": "postbox-api"},
            configure=db.API_BOUNDS.configure,  # docs/operations.md#session-bounds
            name="postbox-api",
        )
        await pool.open(wait=False)
        client = redis_conn.connect(settings, socket_connect_timeout=2.0, socket_timeout=5.0)
        hub = EventHub(lambda: redis_conn.connect(settings, socket_connect_timeout=2.0), settings.redis_prefix)
        app.state.postbox = ApiState(
            settings=settings,
            registry=task_registry,
            pool=pool,
            redis=client,
            hub=hub,
            events=EventPublisher(
                client,
                settings.redis_prefix,
                audience=Audience(client, events_channel(settings.redis_prefix), local=hub.has_clients),
            ),
            metrics=metrics,
            head_revision=migrate.head_revision(),
            waiters=asyncio.Semaphore(results.MAX_WAITERS),
            throttle=AuthThrottle(settings.api_auth_burst, settings.api_auth_refill),
        )
        for warning in start_warnings(settings):
            log.warning(warning)
        lag.start()
        try:
            yield
        finally:
            await lag.stop()
            await hub.close()
            await client.aclose()
            await pool.close()

    app = FastAPI(
        title="postbox",
        version="0.1.0",
        description="Jobs, queues, workers and dead letters of a postbox deployment. "
        'Errors are always `{"error": {"code", "message", "details"}}`.',
        lifespan=lifespan,
    )
    metrics = ApiMetrics()
    lag = LoopLag()
    errors.install(app)

    # Outermost last: the observer counts what the guards answer.
    app.add_middleware(JsonGuard)
    app.add_middleware(BodyGuard, limit=settings.max_payload_bytes + BODY_SLACK, timeout=settings.api_body_timeout)
    app.add_middleware(Shedder, limit=settings.api_max_in_flight, lag=lag, max_lag=settings.api_max_loop_lag)
    app.add_middleware(Observer, metrics=metrics)

    app.include_router(routes_jobs.enqueue_router, prefix="/api/v1")  # the hot path, matched first
    app.include_router(routes_system.router)
    app.include_router(routes_schedules.router, prefix="/api/v1")  # periodic jobs (routes_schedules.py)
    for router in (
        routes_moves.router,  # moving waiting jobs: before routes_jobs' /jobs/{job_id} paths
        routes_jobs.router,
        routes_queues.queues,
        routes_queues.workers,
        routes_dlq.router,
        routes_queues.audit,
        routes_limits.router,  # flow-control limits and overrides
        routes_sessions.router,  # the dashboard's login sessions
        routes_workflows.router,  # workflows (routes_workflows.py)
    ):
        app.include_router(router, prefix="/api/v1")
    for router in routers:  # an application's routes follow the same access policy as postbox's
        app.include_router(router, prefix="/api/v1", dependencies=[Depends(read_access)])
    install_dashboard(app)  # the operators' web dashboard at / (postbox.app.dashboard)
    if settings.api_trusted_proxies:  # added last, so outermost: the client and scheme all the rest see
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.api_trusted_proxies)
    return app
