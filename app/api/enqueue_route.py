"""``POST /api/v1/jobs`` for plain requests: the endpoint called without FastAPI's per-request solving.

The enqueue is the API's hot path. For every request FastAPI solves the route's
parameters afresh (the router's ``read_access`` dependency and its ``X-API-Key``
header, the ``Idempotency-Key`` header, the body model), reading query
parameters, content types and field metadata on the way; that cost more CPU
than the rest of the enqueue did (docs/benchmarks.md, "REST, third round").

A plain request is answered here by the same steps, in FastAPI's order: the
access check (``read_access``, which raises the same 401 or 429), then the body
validated by the same model, then the same endpoint. A plain request is an
``application/json`` body that the model accepts, its content type, API key
and idempotency key each given at most once, the last within its bound. Anything else goes to
FastAPI's own handler, so every refusal (a 422's shape and wording included)
is still FastAPI's. The endpoint returns a finished ``Response`` either way.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from pydantic import ValidationError

from postbox.app.api.json_body import StrictJsonRequest, StrictJsonRoute, parse, replay
from postbox.app.api.schemas import EnqueueRequest
from postbox.app.api.state import read_access

API_KEY_HEADER = b"x-api-key"
IDEMPOTENCY_HEADER = b"idempotency-key"
MAX_IDEMPOTENCY_KEY = 512  # the endpoint's Header(max_length=...): longer goes to FastAPI, which answers 422


def plain_headers(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None] | None:
    """The request's API key and idempotency key when its headers make it plain (else None).

    Plain: one content type, ``application/json`` (parameters allowed), each of
    the two keys given at most once, the idempotency key within its bound.
    """
    api_key: bytes | None = None
    idempotency: bytes | None = None
    content_type: bytes | None = None
    for name, value in headers:
        if name == b"content-type":
            if content_type is not None:
                return None
            content_type = value
        elif name == API_KEY_HEADER:
            if api_key is not None:
                return None
            api_key = value
        elif name == IDEMPOTENCY_HEADER:
            if idempotency is not None:
                return None
            idempotency = value
    if content_type is None or content_type.split(b";", 1)[0].strip().lower() != b"application/json":
        return None
    key = None if idempotency is None else idempotency.decode("latin-1")
    if key is not None and len(key) > MAX_IDEMPOTENCY_KEY:
        return None
    return (None if api_key is None else api_key.decode("latin-1")), key


class EnqueueRoute(StrictJsonRoute):
    """The enqueue route: plain requests straight to the endpoint, the rest through FastAPI.

    ``plain`` (on the class) turns the shortcut off: every request through FastAPI, as the
    tests compare the two; ``plain_answers`` counts the requests it answered, in this process.
    """

    plain = True
    plain_answers = 0

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        standard = super().get_route_handler()
        if [d.dependency for d in self.dependencies] != [read_access]:
            return standard  # included with other dependencies: FastAPI solves them
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            keys = plain_headers(request.scope["headers"]) if self.plain else None
            if keys is None:
                return await standard(request)
            body = await request.body()
            if not body:
                return await standard(Request(request.scope, replay(body, request.receive)))
            strict = StrictJsonRequest(request.scope, replay(body, request.receive))
            await read_access(strict, keys[0])
            try:
                model = EnqueueRequest.model_validate(parse(body))
            except (ValueError, ValidationError):  # FastAPI writes the refusal (422) as for any request
                return await standard(Request(request.scope, replay(body, request.receive)))
            type(self).plain_answers += 1
            response: Response = await endpoint(body=model, request=strict, idempotency_key=keys[1])
            return response

        return handler
