"""``GET /jobs/{id}/result?wait=``: a job's outcome, waiting for it without busy polling.

The wait listens on the lifecycle events (Redis pub/sub, through the app's
:class:`EventHub`) for the job's terminal event and re-reads PostgreSQL when
one arrives; PostgreSQL stays the truth, so it is also re-read every second in
case an event was lost. (To be switched to ``jobs.results.wait_result`` once the
worker's results module lands; the answer's shape stays the same.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from app.api.events_hub import ClientBuffer
from jobs import sql
from jobs.control import NotFoundError
from jobs.events import TERMINAL_EVENTS
from jobs.states import is_terminal

if TYPE_CHECKING:
    from app.api.state import ApiState

RECHECK = 1.0


async def read_result(st: ApiState, job_id: int) -> dict[str, Any]:
    async with st.pool.connection() as conn:
        cur = await conn.execute(sql.SELECT_RESULT, {"id": job_id})
        row = await cur.fetchone()
    if row is None:
        raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
    state, result, error_class, error = row
    finished = is_terminal(state)
    return {
        "id": job_id,
        "state": state,
        "finished": finished,
        "result": result if state == "succeeded" else None,
        "error_class": error_class if finished and state != "succeeded" else None,
        "error": error if finished and state != "succeeded" else None,
    }


async def wait_result(st: ApiState, job_id: int, wait: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait
    answer = await read_result(st, job_id)
    if answer["finished"] or wait <= 0:
        return answer
    buffer = ClientBuffer(cap=16, accept=lambda e: e.get("job_id") == job_id and e.get("type") in TERMINAL_EVENTS)
    subscribed = True
    try:
        await st.hub.add(buffer, wait=min(wait, 2.0))
    except TimeoutError:
        subscribed = False  # Redis unreachable: fall back to re-reading PostgreSQL
    try:
        while True:
            answer = await read_result(st, job_id)
            remaining = deadline - time.monotonic()
            if answer["finished"] or remaining <= 0:
                return answer
            with contextlib.suppress(TimeoutError):
                if subscribed:
                    await asyncio.wait_for(buffer.next(), min(RECHECK, remaining))
                else:
                    await asyncio.sleep(min(RECHECK / 2, remaining))
    finally:
        st.hub.remove(buffer)
