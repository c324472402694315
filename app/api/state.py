"""What every request reaches: the app's shared resources, the database, and the API key check."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
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
from postbox.app.services.audit import Actor
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
    """Constant-time comparison of an API key (both sides hashed first: the time does not depend on length)."""
    if given is None:
        return False
    given_digest = hashlib.sha256(given.encode("utf-8", "surrogatepass")).digest()
    expected_digest = hashlib.sha256(expected.encode("utf-8")).digest()
    return hmac.compare_digest(given_digest, expected_digest)


def _unauthorized() -> ApiError:
    return ApiError(
        401,
        "UNAUTHORIZED",
        "missing or invalid X-API-Key",
        headers={"WWW-Authenticate": 'ApiKey header="X-API-Key"'},
    )


def _disabled() -> ApiError:
    return ApiError(
        403,
        "FORBIDDEN",
        "destructive operations are disabled: POSTBOX_API_KEY is not set "
        "(set it, or POSTBOX_API_INSECURE=true for local development)",
    )


def auth_failed(st: ApiState, reason: str, method: str, path: str, client: str | None, rid: str | None) -> None:
    """Log and count a refused authentication; never the key itself."""
    st.metrics.auth_failures.labels(reason).inc()
    log.warning(
        "authentication failed",
        extra={"reason": reason, "method": method, "path": path, "client": client or "?", "request_id": rid},
    )


def _refuse(request: Request, reason: str, error: ApiError) -> ApiError:
    client = request.client.host if request.client else None
    auth_failed(api_state(request), reason, request.method, request.url.path, client, request_id(request))
    return error


def _authenticated(request: Request, given: str | None) -> bool:
    """True with the right key; a wrong key is refused (401) on every route, a missing one is not."""
    expected = api_state(request).settings.api_key
    if not expected or given is None:
        return False
    if not key_matches(given, expected):
        raise _refuse(request, "invalid", _unauthorized())
    return True


KeyHeader = Header(default=None, alias="X-API-Key", description="The API key (POSTBOX_API_KEY).")


async def read_access(request: Request, x_api_key: str | None = KeyHeader) -> None:
    """Reads and enqueue are open unless POSTBOX_API_KEY_FOR_ALL=true; a wrong key is always refused."""
    settings = api_state(request).settings
    if _authenticated(request, x_api_key):
        return
    if settings.api_key_for_all:
        raise _refuse(request, "missing", _unauthorized())


async def contents_access(request: Request, x_api_key: str | None = KeyHeader) -> bool:
    """Whether this request may read job args and results (else the API redacts them).

    With the key, yes; without it, only when POSTBOX_API_PUBLIC_ARGS=true, or in
    insecure mode without a key configured.
    """
    settings = api_state(request).settings
    if _authenticated(request, x_api_key) or settings.api_public_args:
        return True
    return settings.api_key is None and settings.api_insecure


async def destructive_access(request: Request, x_api_key: str | None = KeyHeader) -> Actor:
    """Destructive operations need the key; without one configured, only insecure mode serves them."""
    settings = api_state(request).settings
    if settings.api_key:
        if not _authenticated(request, x_api_key):
            raise _refuse(request, "missing", _unauthorized())
        return Actor("api:key", request_id(request))
    if not settings.api_insecure:
        raise _refuse(request, "no_key_configured", _disabled())
    return Actor("api:anonymous", request_id(request))


Destructive = Depends(destructive_access)
Contents = Depends(contents_access)


def redacted(item: dict[str, Any], allowed: bool, fields: tuple[str, ...] = ("args", "result")) -> dict[str, Any]:
    """``item`` with its args and result set to null unless ``allowed``; ``redacted`` says which."""
    item["redacted"] = not allowed
    if not allowed:
        for name in fields:
            if name in item:
                item[name] = None
    return item


def start_warnings(settings: Settings) -> list[str]:
    """What the API says loudly at start about its access policy."""
    warnings = []
    if settings.api_key is None and settings.api_insecure:
        warnings.append(
            "INSECURE MODE (POSTBOX_API_INSECURE=true, no POSTBOX_API_KEY): anyone who reaches "
            f"{settings.api_host}:{settings.api_port} may cancel jobs, pause queues and purge dead letters, "
            "and read every job's args. Local development only."
        )
    elif settings.api_key is None:
        warnings.append(
            "POSTBOX_API_KEY is not set: destructive operations are refused (403) and job args are redacted. "
            "Set a key to enable them."
        )
    if settings.api_key is None and not _loopback(settings.api_host):
        warnings.append(f"serving on {settings.api_host}, not a loopback address, without POSTBOX_API_KEY")
    return warnings


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
