"""The request body's limits, enforced while it streams in: size and time, on every route.

A declared ``Content-Length`` over the limit is refused before anything is
read; a chunked body (no length) is counted as it arrives and refused at the
first byte over the limit, so a 100 MB upload costs the API at most the limit
in memory. The whole body must arrive within ``timeout`` seconds of the
request's start: a slow body, or one shorter than its ``Content-Length``,
gets a 408 instead of holding the connection. Once the body is complete the
guard steps aside (a streaming response may wait on the client for long).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from postbox.app.api.errors import error_response


class BodyRefused(HTTPException):
    """Raised from ``receive()``: the app's error handler turns it into the JSON error."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any]) -> None:
        super().__init__(status, message)
        self.code = code
        self.details = dict(details)


def too_large(limit: int, size: str | None = None) -> BodyRefused:
    what = f"request body is {size} bytes" if size is not None else "request body is"
    return BodyRefused(413, "PAYLOAD_TOO_LARGE", f"{what} over the {limit}-byte limit", {"limit": limit})


def too_slow(timeout: float) -> BodyRefused:
    return BodyRefused(
        408, "REQUEST_TIMEOUT", f"request body not received within {timeout:g} s", {"timeout_seconds": timeout}
    )


class BodyGuard:
    """ASGI middleware: at most ``limit`` body bytes, all of them within ``timeout`` seconds."""

    def __init__(
        self, app: ASGIApp, *, limit: int, timeout: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        # ASCII digits only ("²".isdigit() is true, and int() refuses it), and no int() of more
        # than 18 of them (int() refuses past 4,300 digits; no body this guard lets in has 19).
        digits = declared is not None and declared.isascii() and declared.isdigit()
        if declared is not None and (not digits or len(declared) > 18 or int(declared) > self.limit):
            refused = (
                too_large(self.limit, declared if len(declared) <= 18 else f"a {len(declared)}-digit number of")
                if digits
                else BodyRefused(400, "BAD_REQUEST", "invalid Content-Length", {})
            )
            await _answer(refused, scope, receive, send)
            return
        deadline = self.clock() + self.timeout
        received = 0
        complete = False

        async def guarded() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, deadline - self.clock())):
                    message = await receive()
            except TimeoutError:
                raise too_slow(self.timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded, watched)
        except BodyRefused as exc:  # raised where no error handler saw it: answer here
            if started:
                raise
            await _answer(exc, scope, receive, send)


def _content_length(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return str(value.decode("latin-1").strip())
    return None


async def _answer(exc: BodyRefused, scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(exc.status_code, exc.code, str(exc.detail), exc.details, {"Connection": "close"})
    await response(scope, receive, send)
