"""What every request reaches: the app's shared resources, the database, and the API key check."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Header, Request
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from postbox.app.api.errors import ApiError
from postbox.app.api.events_hub import EventHub, EventPublisher
from postbox.app.api.metrics import ApiMetrics
from postbox.control import Actor
from postbox.registry import Registry
from postbox.settings import Settings

log = logging.getLogger("postbox.api")
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class ApiState:
    settings: Settings
    registry: Registry
    pool: AsyncConnectionPool[AsyncConnection[Any]]
    redis: Any  # redis.asyncio.Redis (commands; short socket timeouts)
    hub: EventHub
    events: EventPublisher
    metrics: ApiMetrics
    head_revision: str
    waiters: asyncio.Semaphore  # bounds the result waits (each holds a connection)


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.postbox
    return state


async def db(request: Request) -> AsyncIterator[AsyncConnection[Any]]:
    """A pooled connection for one request (rolled back if the request fails)."""
    async with api_state(request).pool.connection() as conn:
        yield conn


def request_id(request: Request) -> str:
    """The request's id: set by the observer middleware, else the caller's ``X-Request-ID``, else a new one."""
    known = getattr(request.state, "request_id", None)
    if known:
        return str(known)
    given = request.headers.get("x-request-id", "")
    return given if REQUEST_ID_RE.match(given) else new_request_id()


def new_request_id() -> str:
    return uuid.uuid4().hex


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of an API key."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8"))


def _unauthorized() -> ApiError:
    return ApiError(
        401,
        "UNAUTHORIZED",
        "missing or invalid X-API-Key",
        headers={"WWW-Authenticate": 'ApiKey header="X-API-Key"'},
    )


async def read_access(
    request: Request,
    x_api_key: str | None = Header(default=None, alias="X-API-Key", description="Needed with POSTBOX_API_KEY_FOR_ALL."),
) -> None:
    """Reads (and enqueue) are open unless POSTBOX_API_KEY_FOR_ALL=true with a key set."""
    settings = api_state(request).settings
    if settings.api_key and settings.api_key_for_all and not key_matches(x_api_key, settings.api_key):
        raise _unauthorized()


async def destructive_access(
    request: Request,
    x_api_key: str | None = Header(default=None, alias="X-API-Key", description="Needed when POSTBOX_API_KEY is set."),
) -> Actor:
    """Destructive operations need the key when POSTBOX_API_KEY is set; returns who acts."""
    settings = api_state(request).settings
    if settings.api_key:
        if not key_matches(x_api_key, settings.api_key):
            raise _unauthorized()
        return Actor("api:key", request_id(request))
    return Actor("api:anonymous", request_id(request))


Destructive = Depends(destructive_access)
