"""The dashboard's pages and session: ``GET /``, ``GET /static/{name}``, ``ui/session``, ``ui/login``, ``ui/logout``.

The page is one HTML file; everything it loads is addressed relative to it, so
the dashboard works behind a reverse proxy that serves it under a path prefix.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from postbox.app.api.errors import ApiError
from postbox.app.api.state import api_state, auth_failed, key_matches, request_id
from postbox.app.dashboard.session import COOKIE, cookie_key, csrf_token

router = APIRouter(include_in_schema=False)
STATIC = resources.files("postbox.app.dashboard") / "static"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
ASSETS = frozenset({"app.js", "style.css"})
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
PAGE_HEADERS = {
    **HEADERS,
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; connect-src 'self' ws: wss:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
}


def _asset(name: str) -> bytes:
    return (STATIC / name).read_bytes()


@router.get("/")
async def page() -> Response:
    return Response(_asset("index.html"), media_type=TYPES[".html"], headers=PAGE_HEADERS)


@router.get("/static/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise ApiError(404, "NOT_FOUND", f"no asset {name!r}")
    return Response(_asset(name), media_type=TYPES["." + name.rsplit(".", 1)[1]], headers=HEADERS)


def _logged_in(request: Request) -> str | None:
    """The key of the request's cookie when it is the configured one."""
    key = cookie_key(list(request.scope.get("headers") or []))
    expected = api_state(request).settings.api_key
    return key if key and expected and key_matches(key, expected) else None


@router.get("/ui/session")
async def session(request: Request) -> dict[str, Any]:
    """What the page needs to know: whether a key exists, is held, and the CSRF token for actions."""
    settings = api_state(request).settings
    key = _logged_in(request)
    if settings.api_key:
        mode = "key"
    elif settings.api_insecure:
        mode = "insecure"
    else:
        mode = "read-only"
    return {
        "mode": mode,
        "logged_in": key is not None,
        "csrf": csrf_token(key) if key else None,
        "can_act": key is not None or mode == "insecure",
        "can_read_args": key is not None or settings.api_public_args or mode == "insecure",
        "reads_need_key": settings.api_key_for_all,
    }


def _cookie_path(request: Request) -> str:
    return (request.scope.get("root_path") or "").rstrip("/") + "/"


@router.post("/ui/login", status_code=204)
async def login(request: Request) -> Response:
    """Body ``{"key": "..."}``: the right key sets the session cookie; anything else is refused (401)."""
    st = api_state(request)
    try:
        given = orjson.loads(await request.body()).get("key")
    except (orjson.JSONDecodeError, AttributeError):
        given = None
    if not st.settings.api_key:
        raise ApiError(409, "NO_API_KEY", "POSTBOX_API_KEY is not set: there is nothing to log in with")
    if not isinstance(given, str) or not key_matches(given, st.settings.api_key):
        client = request.client.host if request.client else None
        auth_failed(st, "invalid", request.method, request.url.path, client, request_id(request))
        raise ApiError(401, "UNAUTHORIZED", "wrong API key")
    response = Response(status_code=204)
    response.set_cookie(
        COOKIE,
        given,
        path=_cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/ui/logout", status_code=204)
async def logout(request: Request) -> Response:
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path=_cookie_path(request), httponly=True, samesite="strict")
    return response
