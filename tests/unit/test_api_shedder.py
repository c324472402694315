"""The load shedder's decisions, on a bare ASGI app: in-flight limit, loop lag, probes never shed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from postbox.app.api.shedder import LoopLag, Shedder
from tests.harness.wait import wait_until_async


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _status(app: Shedder, path: str) -> tuple[int, dict[str, str]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    await app({"type": "http", "method": "POST", "path": path, "headers": []}, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
    return int(sent[0]["status"]), headers


async def test_a_lagging_loop_sheds_api_requests_but_not_probes() -> None:
    lag = LoopLag()
    shedder = Shedder(_ok, limit=0, lag=lag, max_lag=0.25)
    assert await _status(shedder, "/api/v1/jobs") == (200, {})
    lag.seconds = 0.3
    status, headers = await _status(shedder, "/api/v1/jobs")
    assert (status, headers["retry-after"]) == (503, "1")
    assert (await _status(shedder, "/health"))[0] == 200
    assert (await _status(shedder, "/api/v1/jobs/7/result"))[0] == 200
    lag.seconds = 0.2
    assert (await _status(shedder, "/api/v1/jobs"))[0] == 200


async def test_the_lag_monitor_sees_a_blocked_loop_and_averages_one_stall_away() -> None:
    lag = LoopLag(interval=0.01, smoothing=0.2)
    lag.start()
    try:
        await asyncio.sleep(0.05)
        lag.seconds = 0.0  # the average before the stall (a busy machine's lag must not count here)
        time.sleep(0.3)  # noqa: ASYNC251  (the process out of CPU: nothing else runs on the loop)
        await wait_until_async(lambda: lag.last >= 0.25, 30, interval=0.01, message="the stall measured")
        assert lag.last < 5
        assert lag.seconds <= 0.2 * lag.last + 0.05  # one stall moves the average a fifth of the way
    finally:
        await lag.stop()
