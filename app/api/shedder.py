"""Load shedding: a bounded number of API requests in flight; the next one is a 503 at once.

Without a bound, an overloaded API queues requests (for the pool, for the
event loop) and answers every one of them late: at twice its capacity it
served a steady rate with a median latency of seconds. With the bound, the
requests over it are answered in microseconds with ``503 OVERLOADED`` and
``Retry-After``, and those admitted keep their normal latency. Probes
(``/health``, ``/ready``, ``/metrics``) and result waits (bounded by their own
semaphore) are not counted.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from postbox.app.api.errors import error_response

API_PREFIX = "/api/v1/"
RETRY_AFTER_SECONDS = 1


class Shedder:
    """ASGI middleware: at most ``limit`` ``/api/v1`` requests at once (0 = no limit)."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0
        self.shed = 0  # answered 503 since the start (tests read it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.limit <= 0 or scope["type"] != "http" or not _counted(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.shed += 1
            response = error_response(
                503,
                "OVERLOADED",
                f"the API is at its limit of {self.limit} requests in flight; retry shortly",
                {"in_flight_limit": self.limit},
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
            await response(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def _counted(path: str) -> bool:
    return path.startswith(API_PREFIX) and not path.endswith("/result")
