"""The request observer: a request id on every request, and every response counted and timed.

Plain ASGI, outside every other middleware of the app: a response made by a
middleware (413, 408, 503) is counted as well as a route's, and an exception
that escapes the app is counted as the 500 the server then answers.
"""

from __future__ import annotations

import time

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postbox.app.api.metrics import ApiMetrics
from postbox.app.api.state import REQUEST_ID_RE, new_request_id

API_PREFIX = "/api/v1"


class Observer:
    def __init__(self, app: ASGIApp, *, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        rid = _request_id(scope)
        scope.setdefault("state", {})["request_id"] = rid
        status = 500

        async def stamped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await send(message)

        try:
            await self.app(scope, receive, stamped)
        finally:  # an exception here is the 500 the server answers
            self._count(scope, status, started)

    def _count(self, scope: Scope, status: int, started: float) -> None:
        self.metrics.served(scope["method"], _template(scope), status, time.perf_counter() - started)


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            given = value.decode("latin-1")
            return given if REQUEST_ID_RE.match(given) else new_request_id()
    return new_request_id()


def _template(scope: Scope) -> str:
    template = getattr(scope.get("route"), "path", None)
    if template is None:
        return "unmatched"
    if scope["path"].startswith(API_PREFIX + "/") and not template.startswith(API_PREFIX):
        return API_PREFIX + template  # included routes keep their own, unprefixed path
    return str(template)
