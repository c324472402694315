"""The dashboard's login: the API key kept in an HttpOnly, SameSite=Strict cookie, with a CSRF token on actions.

The browser never holds the key where a script can read it. :class:`CookieKey`
(an ASGI middleware) hands the cookie's key to the API as ``X-API-Key``, so the
dashboard's requests meet exactly the access policy, audit and limits of the
REST calls they are. A request that changes something (any method but GET, HEAD
and OPTIONS) with the cookie must also carry ``X-CSRF-Token``: an HMAC of a fixed
label under the key, which only a page of this origin can fetch (``GET
ui/session``). A WebSocket gets the key only when its ``Origin`` is this host.
A cookie holding a key that is no longer the configured one is ignored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

import orjson

from postbox.app.api.state import key_matches

COOKIE = "postbox_key"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
EXEMPT_PATHS = frozenset({"/ui/login", "/ui/logout"})  # login proves the key itself; logout only forgets it

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def csrf_token(key: str) -> str:
    """The CSRF token of a session holding ``key`` (stateless: the same for every session with that key)."""
    return hmac.new(key.encode("utf-8"), b"postbox-dashboard-csrf-v1", hashlib.sha256).hexdigest()


def cookie_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key in the request's ``postbox_key`` cookie, if any."""
    for name, value in headers:
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:
                continue
            if COOKIE in jar and jar[COOKIE].value:
                return jar[COOKIE].value
    return None


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> str | None:
    for name, value in headers:
        if name == wanted:
            return value.decode("latin-1")
    return None


def same_origin(headers: list[tuple[bytes, bytes]]) -> bool:
    """True when the request's ``Origin`` (if any) names the host it was sent to."""
    origin = _header(headers, b"origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == (_header(headers, b"host") or "")


def app_path(scope: Scope) -> str:
    """The request's path inside the app (``root_path`` removed)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class CookieKey:
    """Turns the dashboard's cookie into ``X-API-Key`` for the API, checking CSRF on actions."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        key = cookie_key(headers)
        if key is None or _header(headers, b"x-api-key") is not None:
            await self.app(scope, receive, send)
            return
        expected = scope["app"].state.postbox.settings.api_key
        if not expected or not key_matches(key, expected):
            await self.app(scope, receive, send)  # a stale cookie: the request goes on without a key
            return
        if scope["type"] == "websocket":
            if not same_origin(headers):
                await self.app(scope, receive, send)
                return
        elif scope["method"] not in SAFE_METHODS and app_path(scope) not in EXEMPT_PATHS:
            given = _header(headers, CSRF_HEADER.encode()) or ""
            if not same_origin(headers) or not hmac.compare_digest(given.encode(), csrf_token(key).encode()):
                await _refuse(send)
                return
        headers.append((b"x-api-key", key.encode("latin-1")))
        await self.app({**scope, "headers": headers}, receive, send)


async def _refuse(send: Send) -> None:
    body = orjson.dumps(
        {"error": {"code": "CSRF_FAILED", "message": "missing or wrong X-CSRF-Token (reload the dashboard)"}}
    )
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
