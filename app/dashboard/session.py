"""The dashboard's login: a server-side session whose random token is an HttpOnly cookie.

``POST ui/login`` with the right API key makes a session
(:mod:`postbox.app.services.sessions`: its token's SHA-256 in PostgreSQL, an
expiry, the mark of the key it was made with) and sets the token as a cookie:
``__Host-postbox_session`` (``Secure``, ``Path=/``, no ``Domain``) when the page
is served over HTTPS, else ``postbox_session`` under the dashboard's path; both
``HttpOnly`` and ``SameSite=Strict``, never the key itself.

:class:`SessionCookie` (an ASGI middleware) looks the cookie's session up on
every request and, when it is live and made with the current key, marks the
request as holding the key (``postbox.app.api.state``), so the dashboard's requests meet exactly the access
policy, audit and limits of the REST calls they are. A request that changes
something (any method but GET, HEAD and OPTIONS, logout included) with the
cookie must also carry ``X-CSRF-Token`` (an HMAC of a fixed label under the
session's token, which only a page of this origin can fetch with ``GET
ui/session``) and come from this origin. A WebSocket gets the key only when its
``Origin`` is this host. An expired, revoked or old-key session is ignored.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

import orjson

from postbox.app.api.state import SCOPE_SESSION, SCOPE_TOKEN
from postbox.app.services import sessions

log = logging.getLogger(__name__)
COOKIE = "postbox_session"  # served over plain HTTP (a loopback address, a test)
SECURE_COOKIE = "__Host-postbox_session"  # served over HTTPS: host-only, Secure, Path=/
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
EXEMPT_PATHS = frozenset({"/ui/login"})  # login proves the key itself
LOOKUP_TIMEOUT = 5.0

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def csrf_token(token: str) -> str:
    """The CSRF token of the session whose cookie holds ``token``."""
    return hmac.new(token.encode("utf-8"), b"postbox-dashboard-csrf-v2", hashlib.sha256).hexdigest()


def cookie_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The session token in the request's cookie (the ``__Host-`` one first), if any."""
    found: dict[str, str] = {}
    for name, value in headers:
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:
                continue
            for wanted in (SECURE_COOKIE, COOKIE):
                if wanted in jar and jar[wanted].value:
                    found.setdefault(wanted, jar[wanted].value)
    return found.get(SECURE_COOKIE) or found.get(COOKIE)


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> str | None:
    for name, value in headers:
        if name == wanted:
            return value.decode("latin-1")
    return None


def same_origin(headers: list[tuple[bytes, bytes]], *, required: bool = False) -> bool:
    """True when the request's ``Origin`` names the host it was sent to (or, unless ``required``, is absent)."""
    origin = _header(headers, b"origin")
    if origin is None:
        return not required
    return urlsplit(origin).netloc == (_header(headers, b"host") or "")


def app_path(scope: Scope) -> str:
    """The request's path inside the app (``root_path`` removed)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class SessionCookie:
    """Marks a request with a live session's cookie as holding the key, checking CSRF on actions."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        token = cookie_token(headers)
        st = scope["app"].state.postbox
        key = st.settings.api_key
        if token is None or not key or _header(headers, b"x-api-key") is not None:
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT), st.pool.connection(timeout=LOOKUP_TIMEOUT) as conn:
                session_id = await sessions.lookup(conn, token, key)
        except Exception as exc:
            log.warning("dashboard session not checked: %s", type(exc).__name__)
            if scope["type"] == "http":
                await _respond(send, 503, "UNAVAILABLE", "the session store (PostgreSQL) did not answer", retry=2)
                return
            session_id = None
        if session_id is None:
            await self.app(scope, receive, send)  # expired, revoked or made with an old key: no key
            return
        if scope["type"] == "websocket":
            if not same_origin(headers):
                await self.app(scope, receive, send)
                return
        elif scope["method"] not in SAFE_METHODS and app_path(scope) not in EXEMPT_PATHS:
            given = _header(headers, CSRF_HEADER.encode()) or ""
            if not same_origin(headers) or not hmac.compare_digest(given.encode(), csrf_token(token).encode()):
                await _respond(send, 403, "CSRF_FAILED", "missing or wrong X-CSRF-Token (reload the dashboard)")
                return
        inner = {**scope, SCOPE_SESSION: session_id, SCOPE_TOKEN: token}  # the API reads it as the key
        await self.app(inner, receive, send)


async def _respond(send: Send, status: int, code: str, message: str, retry: int | None = None) -> None:
    body = orjson.dumps({"error": {"code": code, "message": message, "details": {}}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry is not None:
        headers.append((b"retry-after", str(retry).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
