"""``GET /jobs/{id}/result?wait=``: a job's outcome, waiting for it without polling.

Reads with :func:`postbox.results.get_result_async` on a pooled connection; waits
with :func:`postbox.results.wait_result` (LISTEN on the workers' result
notifications). Each wait holds one PostgreSQL connection of its own, so at
most ``MAX_WAITERS`` wait at once; a request beyond that waits for a slot
within its own deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from postbox.app.services.errors import NotFoundError
from postbox.results import JobResult, get_result_async
from postbox.results import wait_result as wait_finished

if TYPE_CHECKING:
    from postbox.app.api.state import ApiState

MAX_WAITERS = 32


def _answer(result: JobResult) -> dict[str, Any]:
    return {
        "id": result.job_id,
        "state": result.state,
        "finished": result.finished,
        "result": result.value if result.ok else None,
        "error_class": result.error_class if result.finished and not result.ok else None,
        "error": result.error if result.finished and not result.ok else None,
    }


async def read_result(st: ApiState, job_id: int) -> JobResult:
    async with st.pool.connection() as conn:
        result = await get_result_async(conn, job_id)
    if result is None:
        raise NotFoundError(f"job {job_id} not found", details={"id": job_id})
    return result


async def wait_result(st: ApiState, job_id: int, wait: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait
    result = await read_result(st, job_id)
    if result.finished or wait <= 0:
        return _answer(result)
    try:
        async with asyncio.timeout(wait):
            async with st.waiters:
                remaining = max(0.0, deadline - time.monotonic())
                result = await wait_finished(job_id, remaining, database_url=st.settings.require_database_url())
    except TimeoutError:
        result = await read_result(st, job_id)
    except LookupError:
        raise NotFoundError(f"job {job_id} not found", details={"id": job_id}) from None
    return _answer(result)
