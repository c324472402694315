"""Load shedding: a 503 at once instead of a queue, when the API is over what it can serve.

Without it, an overloaded API queues requests (for the pool, for the event
loop) and answers every one of them late: at twice its capacity it served a
steady rate with a median latency of seconds. Two signs of overload, each
answered with ``503 OVERLOADED`` and ``Retry-After``:

- more than ``limit`` requests in flight (waiting on the database, mostly);
- the event loop running late by more than ``max_lag`` seconds (the process
  is out of CPU: requests wait before any code of ours sees them). A refusal
  costs a fraction of an enqueue, so shedding brings the lag back down.

Probes (``/health``, ``/ready``, ``/metrics``) and result waits (bounded by
their own semaphore) are never shed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from postbox.app.api.errors import error_response
from postbox.cancellation import cancel_all

API_PREFIX = "/api/v1/"
RETRY_AFTER_SECONDS = 1


class LoopLag:
    """How late the event loop runs: a task sleeps ``interval`` and measures the overshoot.

    ``last`` is the latest sample; ``seconds`` an exponential average of them
    (weight ``smoothing``), so that one stall (a GC pause, a slow import) sheds
    nothing and a sustained lag does.
    """

    def __init__(
        self, interval: float = 0.05, smoothing: float = 0.2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.smoothing = smoothing
        self.clock = clock
        self.last = 0.0
        self.seconds = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])

    async def _watch(self) -> None:
        while True:
            started = self.clock()
            await asyncio.sleep(self.interval)
            self.last = max(0.0, self.clock() - started - self.interval)
            self.seconds += self.smoothing * (self.last - self.seconds)


class Shedder:
    """ASGI middleware: at most ``limit`` ``/api/v1`` requests at once (0 = no limit), none while the loop lags."""

    def __init__(self, app: ASGIApp, *, limit: int, lag: LoopLag | None = None, max_lag: float = 0.0) -> None:
        self.app = app
        self.limit = limit
        self.lag = lag
        self.max_lag = max_lag
        self.in_flight = 0

    def _overloaded(self) -> dict[str, float] | None:
        if 0 < self.limit <= self.in_flight:
            return {"in_flight_limit": self.limit}
        if self.lag is not None and self.max_lag > 0 and self.lag.seconds > self.max_lag:
            return {"loop_lag_seconds": round(self.lag.seconds, 3), "max_lag_seconds": self.max_lag}
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _counted(scope["path"]):
            await self.app(scope, receive, send)
            return
        over = self._overloaded()
        if over is not None:
            response = error_response(
                503,
                "OVERLOADED",
                "the API is over its capacity; retry shortly",
                over,
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
