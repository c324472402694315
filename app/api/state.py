"""What every request reaches: the app's shared resources, the database, and the API key check."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Header, Request
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from postbox import encryption
from postbox.app.api.errors import ApiError
from postbox.app.api.events_hub import EventHub, EventPublisher
from postbox.app.api.metrics import ApiMetrics
from postbox.app.api.throttle import AuthThrottle
from postbox.app.services.audit import Actor, record_audit
from postbox.registry import Registry
from postbox.settings import Settings

log = logging.getLogger(__name__)
# Set by the dashboard's session middleware (postbox.app.dashboard.session) on a request
# that carries a live session's cookie: the request holds the key, as with X-API-Key.
SCOPE_SESSION = "postbox.session"
SCOPE_TOKEN = "postbox.session_token"
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
    throttle: AuthThrottle  # wrong keys per client (postbox.app.api.throttle)


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
    """32 random hex digits (``secrets.token_hex``: a fifth of ``uuid4().hex``'s cost, 6 more random bits)."""
    return secrets.token_hex(16)


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


def client_address(client: Any) -> str:
    """The client's address (``request.client``: the forwarded one behind a trusted proxy)."""
    host = getattr(client, "host", None)
    return str(host) if host else "unknown"


def throttled(st: ApiState, client: str, surface: str) -> ApiError | None:
    """The 429 for a client out of tries (``postbox.app.api.throttle``), else None."""
    wait = st.throttle.retry_after(client)
    if not wait:
        return None
    st.metrics.auth_throttled.labels(surface).inc()
    return ApiError(
        429,
        "TOO_MANY_AUTH_FAILURES",
        f"too many wrong keys from this address: try again in {wait} s",
        {"retry_after_seconds": wait},
        headers={"Retry-After": str(wait)},
    )


async def key_failed(st: ApiState, surface: str, method: str, path: str, client: str, rid: str | None) -> None:
    """A wrong key: logged, counted, taken from the client's tries and written to the audit log.

    The audit row is written in a transaction of its own; if PostgreSQL cannot take it
    (within 2 s) the refusal stands and the log says so.
    """
    auth_failed(st, "invalid", method, path, client, rid)
    now_throttled = st.throttle.failed(client)
    details = {"surface": surface, "method": method, "path": path, "throttled": now_throttled}
    try:
        async with asyncio.timeout(AUDIT_TIMEOUT), st.pool.connection(timeout=AUDIT_TIMEOUT) as conn:
            await record_audit(conn, Actor("unauthenticated", rid), "auth.failed", f"client:{client}", details)
    except Exception as exc:
        log.warning("wrong key not audited: %s", type(exc).__name__, extra={"client": client})


AUDIT_TIMEOUT = 2.0


def _refuse(request: Request, reason: str, error: ApiError) -> ApiError:
    client = request.client.host if request.client else None
    auth_failed(api_state(request), reason, request.method, request.url.path, client, request_id(request))
    return error


async def _authenticated(request: Request, given: str | None) -> bool:
    """True with the right key; a wrong key is refused (401) on every route, a missing one is not.

    A client out of tries is refused any key (429, ``postbox.app.api.throttle``).
    """
    st = api_state(request)
    expected = st.settings.api_key
    if not expected:
        return False
    if given is None:
        return request.scope.get(SCOPE_SESSION) is not None
    client = client_address(request.client)
    refusal = throttled(st, client, "api")
    if refusal is not None:
        raise refusal
    if not key_matches(given, expected):
        await key_failed(st, "api", request.method, request.url.path, client, request_id(request))
        raise _unauthorized()
    return True


KeyHeader = Header(default=None, alias="X-API-Key", description="The API key (POSTBOX_API_KEY).")


async def read_access(request: Request, x_api_key: str | None = KeyHeader) -> None:
    """Reads and enqueue are open unless POSTBOX_API_KEY_FOR_ALL=true; a wrong key is always refused."""
    settings = api_state(request).settings
    if await _authenticated(request, x_api_key):
        return
    if settings.api_key_for_all:
        raise _refuse(request, "missing", _unauthorized())


async def contents_access(request: Request, x_api_key: str | None = KeyHeader) -> bool:
    """Whether this request may read job args and results (else the API redacts them).

    With the key, yes; without it, only when POSTBOX_API_PUBLIC_ARGS=true, or in
    insecure mode without a key configured.
    """
    settings = api_state(request).settings
    if await _authenticated(request, x_api_key) or settings.api_public_args:
        return True
    return settings.api_key is None and settings.api_insecure


async def process_access(request: Request, x_api_key: str | None = KeyHeader) -> bool:
    """Whether this request may read workers' and relays' hosts and pids (else they are null)."""
    settings = api_state(request).settings
    if await _authenticated(request, x_api_key):
        return True
    return settings.api_key is None and settings.api_insecure


async def require_key_for_sensitive(request: Request, x_api_key: str | None = KeyHeader) -> None:
    """For reads that are sensitive as a whole (the audit log, sessions): the key, or insecure mode without one."""
    settings = api_state(request).settings
    if await _authenticated(request, x_api_key):
        return
    if settings.api_key:
        raise _refuse(request, "missing", _unauthorized())
    if not settings.api_insecure:
        raise _refuse(
            request,
            "no_key_configured",
            ApiError(403, "FORBIDDEN", "this read needs POSTBOX_API_KEY (set it, or POSTBOX_API_INSECURE=true)"),
        )


async def destructive_access(request: Request, x_api_key: str | None = KeyHeader) -> Actor:
    """Destructive operations need the key; without one configured, only insecure mode serves them."""
    settings = api_state(request).settings
    if settings.api_key:
        if not await _authenticated(request, x_api_key):
            raise _refuse(request, "missing", _unauthorized())
        session_id = request.scope.get(SCOPE_SESSION) if x_api_key is None else None
        return Actor("api:key" if session_id is None else f"session:{session_id}", request_id(request))
    if not settings.api_insecure:
        raise _refuse(request, "no_key_configured", _disabled())
    return Actor("api:anonymous", request_id(request))


Destructive = Depends(destructive_access)
Contents = Depends(contents_access)
SensitiveRead = Depends(require_key_for_sensitive)
Processes = Depends(process_access)


# What a job shows that may carry argument values or name a caller (an error message, a
# traceback's locals, a dedup key made of an email address): withheld with its args.
SENSITIVE_JOB_FIELDS = ("dedup_key", "last_error", "error")
SENSITIVE_ATTEMPT_FIELDS = ("error", "traceback")
# What names a machine: a worker's or a relay's host and pid.
SENSITIVE_PROCESS_FIELDS = ("host", "pid")


def redacted(item: dict[str, Any], allowed: bool, fields: tuple[str, ...] = ("args", "result")) -> dict[str, Any]:
    """``item`` with ``fields`` and its sensitive fields (errors, tracebacks, dedup key) null unless ``allowed``.

    ``redacted`` says whether anything was withheld. An allowed reader sees an
    encrypted task's args opened when this process has their key, else sealed.
    """
    item["redacted"] = not allowed
    if not allowed:
        redact_job(item)
        for name in fields:
            if name in item:
                item[name] = None
    else:
        if "args" in fields:
            opened_args(item)
        if "result" in fields and isinstance(item.get("id"), int):
            item["result"] = encryption.open_result(item["id"], item.get("result"))
    return item


def opened_args(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` (a job) with its sealed args opened, when this process has the key (:mod:`postbox.encryption`).

    Without the key, or when they do not open (altered, another task's), the envelope stays: never a guess.
    """
    task = item.get("task")
    if isinstance(task, str):
        try:
            item["args"] = encryption.open_args(task, item.get("args"))
        except encryption.EncryptionError as exc:
            log.warning("job %s: its args stay sealed: %s", item.get("id"), exc)
    return item


def redact_job(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` (a job, a summary, a result) without its errors, tracebacks and dedup key."""
    for name in SENSITIVE_JOB_FIELDS:
        if name in item:
            item[name] = None
    if isinstance(item.get("progress"), dict):  # the numbers are not sensitive; the handler's note may be
        item["progress"] = {**item["progress"], "note": None}
    for attempt in item.get("history") or ():
        for name in SENSITIVE_ATTEMPT_FIELDS:
            if name in attempt:
                attempt[name] = None
    return item


def redacted_page(page: dict[str, Any], allowed: bool) -> dict[str, Any]:
    """A page of jobs (``items``) with each one's sensitive fields null unless ``allowed``."""
    if not allowed:
        for item in page.get("items") or ():
            redact_job(item)
    return page


def redacted_process(item: dict[str, Any], allowed: bool) -> dict[str, Any]:
    """A worker or relay without its host and pid unless ``allowed``."""
    if not allowed:
        for name in SENSITIVE_PROCESS_FIELDS:
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
