"""Request bodies as JSON, parsed strictly: what the database and the worker can hold, or a 4xx.

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
