"""Request bodies as JSON, parsed strictly: what the database and the worker can hold, or a 4xx.

Two layers: :class:`JsonGuard` checks every JSON body before any route sees it
(so a route that parses with Python's ``json``, an application's included, never
gets what ``parse`` refuses), and :class:`StrictJsonRoute` makes a route parse
with :func:`parse` itself.

Python's ``json`` module accepts what PostgreSQL and the worker then refuse:
``NaN`` and ``Infinity``, lone surrogates (``"\\ud800"``), and nesting deep
enough to exhaust the interpreter's stack (a 500). orjson refuses all three
with a ``JSONDecodeError`` (a 422 or the route's own 4xx). orjson reads an
integer wider than 64 bits as a float, silently: a body with such a long run
of digits is parsed again with ``json`` so that the integer stays exact and
the enqueue validation can refuse it by its true value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postbox.app.api.errors import error_response

LONG_INTEGER = re.compile(rb"\d{19}")  # at least 19 digits: may not fit in a signed 64-bit integer


def parse(body: bytes) -> Any:
    """The body's JSON value; raises :class:`json.JSONDecodeError` (a ``ValueError``) when refused."""
    value = orjson.loads(body)
    if LONG_INTEGER.search(body):
        try:
            value = json.loads(body)
        except RecursionError:  # orjson allows 1024 levels; a small stack may hold fewer
            raise json.JSONDecodeError("nested too deeply", body.decode("utf-8", "replace"), 0) from None
    return value


class StrictJsonRequest(Request):
    """A request whose ``json()`` is :func:`parse`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """An API route whose body (and ``request.json()`` in the endpoint) is parsed by :func:`parse`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict


class JsonGuard:
    """ASGI middleware: a JSON body (or a body without a Content-Type) that :func:`parse` refuses is a 422.

    It reads the body through the ``receive`` it is given (inside the body
    guard: the size and time limits hold) and hands the app the same bytes.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _may_hold_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                await self.app(scope, replay(b"".join(chunks), receive, message), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            try:
                parse(body)
            except json.JSONDecodeError as exc:
                problem = f"invalid JSON: {exc.msg}"
                response = error_response(
                    422,
                    "VALIDATION_ERROR",
                    f"body: {problem}",
                    {"field": "body", "errors": [{"field": "body", "message": problem}]},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, replay(body, receive), send)


def _may_hold_json(scope: Scope) -> bool:
    """A body is announced, and it is JSON or untyped (FastAPI parses an untyped body as JSON)."""
    announced = False
    content_type = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            announced = announced or value.strip() not in (b"", b"0")
        elif name == b"transfer-encoding":
            announced = True
        elif name == b"content-type":
            content_type = value.decode("latin-1").split(";", 1)[0].strip().lower()
    if not announced:
        return False
    return content_type is None or content_type == "application/json" or content_type.endswith("+json")


def replay(body: bytes, receive: Receive, pending: Message | None = None) -> Receive:
    """A ``receive`` that gives ``body`` once (then ``pending``, if any), then the client's next messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent, pending
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": pending is not None}
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    return replayed
