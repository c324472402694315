"""``/api/v1/bulk/{action}``: cancel, requeue or discard many jobs, chosen by id or by a filter.

Each job goes through the same operation as its REST call (``POST
/api/v1/jobs/{id}/cancel``, ``/dlq/{id}/requeue``, ``/dlq/{id}/discard``), in its
own transaction with its own audit row; a job the operation refuses (finished,
not a dead letter...) is counted as skipped with the refusal's code, and the
others go on. A filter selects at most ``BULK_MAX`` jobs, newest first; with a text match, among
the newest ``TEXT_WINDOW`` ids of the filter only, as its count does.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from psycopg import AsyncConnection
from pydantic import BaseModel, ConfigDict, Field, model_validator

from postbox.app.api.errors import ApiError, responses
from postbox.app.api.state import Contents, Destructive, api_state, db, read_access
from postbox.app.dashboard import queries
from postbox.app.dashboard.search import BULK_MAX, TEXT_MAX, JobFilter
from postbox.app.dashboard.views import match_params, text_window
from postbox.app.services import dlq
from postbox.app.services import jobs as job_service
from postbox.app.services.audit import Actor
from postbox.app.services.checks import MAX_BIGINT
from postbox.app.services.errors import ServiceError

router = APIRouter(prefix="/bulk", tags=["bulk"], dependencies=[Depends(read_access)])
Action = Literal["cancel", "requeue", "discard"]


class FilterBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queue: str | None = None
    task: str | None = None
    state: str | None = None
    discarded: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = Field(default=None, min_length=1, max_length=TEXT_MAX)


class BulkRequest(BaseModel):
    """Exactly one of ``ids`` (the selected rows) and ``filter`` (every job matching it)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[Annotated[int, Field(ge=1, le=MAX_BIGINT)]] | None = Field(default=None, max_length=BULK_MAX)
    filter: FilterBody | None = None

    @model_validator(mode="after")
    def one_of(self) -> BulkRequest:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give exactly one of ids and filter")
        return self


class BulkResult(BaseModel):
    action: str
    matched: int
    done: int
    skipped: dict[str, int]
    done_ids: list[int]


@router.post(
    "/{action}",
    response_model=BulkResult,
    summary="Cancel, requeue or discard jobs by id or by filter (each audited like its REST call)",
    responses=responses(400, 401, 403, 422),
)
async def bulk(
    action: Action,
    body: BulkRequest,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
    contents: bool = Contents,
) -> dict[str, Any]:
    if body.ids is not None:
        ids = list(dict.fromkeys(body.ids))
    else:
        assert body.filter is not None
        if body.filter.text is not None and not contents:
            raise ApiError(403, "FORBIDDEN", "a text match on args needs the API key")
        found = JobFilter(**body.filter.model_dump())
        async with conn.cursor() as cur:
            params = await match_params(cur, found)
            await text_window(cur, found, params)  # the jobs "select all matching" counted
            await cur.execute(queries.active().MATCH_IDS, {**params, "limit": BULK_MAX})
            ids = [int(row[0]) for row in await cur.fetchall()]
    await conn.commit()  # each job below runs in its own transaction
    st = api_state(request)
    skipped: Counter[str] = Counter()
    done: list[int] = []
    for job_id in ids:
        try:
            if action == "cancel":
                outcome = await job_service.cancel_job(conn, job_id, actor)
                if not outcome.cancel_requested:
                    await st.events.publish(
                        "cancelled",
                        job_id=job_id,
                        queue=outcome.queue,
                        task=outcome.task,
                        attempt=outcome.attempts,
                    )
            elif action == "requeue":
                await dlq.requeue_dead(conn, job_id, actor)
            else:
                await dlq.discard_dead(conn, job_id, actor)
        except ServiceError as exc:
            skipped[exc.code] += 1
            continue
        done.append(job_id)
    return {"action": action, "matched": len(ids), "done": len(done), "skipped": dict(skipped), "done_ids": done}
