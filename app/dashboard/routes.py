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
from postbox.app.api.state import (
    SCOPE_SESSION,
    SCOPE_TOKEN,
    api_state,
    client_address,
    key_failed,
    key_matches,
    request_id,
    throttled,
)
from postbox.app.dashboard.session import COOKIE, SECURE_COOKIE, cookie_token, csrf_token, same_origin
from postbox.app.services import sessions
from postbox.app.services.audit import Actor, record_audit

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


def _session(request: Request) -> tuple[int, str] | None:
    """The request's live session (id, token), as the middleware found it."""
    session_id, token = request.scope.get(SCOPE_SESSION), request.scope.get(SCOPE_TOKEN)
    return (int(session_id), str(token)) if session_id is not None and token else None


@router.get("/ui/session")
async def session(request: Request) -> dict[str, Any]:
    """What the page needs to know: whether a key exists, a session is live, and its CSRF token for actions."""
    settings = api_state(request).settings
    live = _session(request)
    if settings.api_key:
        mode = "key"
    elif settings.api_insecure:
        mode = "insecure"
    else:
        mode = "read-only"
    return {
        "mode": mode,
        "logged_in": live is not None,
        "csrf": csrf_token(live[1]) if live else None,
        "can_act": live is not None or mode == "insecure",
        "can_read_args": live is not None or settings.api_public_args or mode == "insecure",
        "reads_need_key": settings.api_key_for_all,
    }


def _cookie_path(request: Request) -> str:
    return (request.scope.get("root_path") or "").rstrip("/") + "/"


def _forget(request: Request, response: Response) -> None:
    """Delete both session cookies (the ``__Host-`` one is deleted with its own attributes)."""
    response.delete_cookie(COOKIE, path=_cookie_path(request), httponly=True, samesite="strict")
    if request.url.scheme == "https":
        response.delete_cookie(SECURE_COOKIE, path="/", secure=True, httponly=True, samesite="strict")


@router.post("/ui/login", status_code=204)
async def login(request: Request) -> Response:
    """Body ``{"key": "..."}``: the right key makes a session and sets its cookie; a wrong one is refused (401).

    A client that sent too many wrong keys is refused any key for a while (429, ``Retry-After``).
    """
    st = api_state(request)
    try:
        given = orjson.loads(await request.body()).get("key")
    except (orjson.JSONDecodeError, AttributeError):
        given = None
    if not st.settings.api_key:
        raise ApiError(409, "NO_API_KEY", "POSTBOX_API_KEY is not set: there is nothing to log in with")
    client = client_address(request.client)
    refusal = throttled(st, client, "login")
    if refusal is not None:
        raise refusal
    rid = request_id(request)
    if not isinstance(given, str) or not key_matches(given, st.settings.api_key):
        await key_failed(st, "login", request.method, request.url.path, client, rid)
        raise ApiError(401, "UNAUTHORIZED", "wrong API key")
    previous = cookie_token(list(request.scope.get("headers") or []))
    async with st.pool.connection() as conn:
        if previous:  # a new login replaces the browser's old session
            await sessions.revoke_token(conn, previous)
        made = await sessions.create(
            conn,
            st.settings.api_key,
            client=client,
            user_agent=request.headers.get("user-agent"),
            ttl=st.settings.api_session_ttl,
        )
        await record_audit(
            conn, Actor(f"session:{made.id}", rid), "session.login", f"session:{made.id}", {"client": client}
        )
    response = Response(status_code=204)
    https = request.url.scheme == "https"
    response.set_cookie(
        SECURE_COOKIE if https else COOKIE,
        made.token,
        max_age=int(st.settings.api_session_ttl),
        path="/" if https else _cookie_path(request),
        httponly=True,
        samesite="strict",
        secure=https,
    )
    return response


@router.post("/ui/logout", status_code=204)
async def logout(request: Request) -> Response:
    """End the session (deleted in PostgreSQL) and its cookie.

    With a live session the middleware has checked the CSRF token and the origin.
    Without one (expired, revoked) only a request from this origin (``Origin`` sent and
    equal to ``Host``) clears the stale cookie: a form on another site cannot.
    """
    live = _session(request)
    if live is None and not same_origin(list(request.scope.get("headers") or []), required=True):
        raise ApiError(403, "CSRF_FAILED", "logout must come from the dashboard's own page")
    if live is not None:
        st = api_state(request)
        async with st.pool.connection() as conn:
            await sessions.revoke(conn, live[0])
            await record_audit(
                conn, Actor(f"session:{live[0]}", request_id(request)), "session.logout", f"session:{live[0]}"
            )
    response = Response(status_code=204)
    _forget(request, response)
    return response
