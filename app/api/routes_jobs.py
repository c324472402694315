"""``/api/v1/jobs``: enqueue, get (with history), result, list, cancel."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql
from postbox.app.api import results
from postbox.app.api.enqueue_route import MAX_IDEMPOTENCY_KEY, EnqueueRoute
from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.params import Cursor, JobId, Limit, QueueFilter, StateFilter, TaskFilter
from postbox.app.api.schemas import CancelResult, EnqueuedJob, EnqueueRequest, Job, JobPage, JobResult
from postbox.app.api.state import Contents, Destructive, api_state, db, read_access, redacted, redacted_page
from postbox.app.services import jobs as job_service
from postbox.app.services.audit import Actor
from postbox.app.services.results import as_dict
from postbox.errors import InvalidArgsError, InvalidOptionError, QueueFullError
from postbox.producer import EnqueueOptions, JobRow, Limits, prepare

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute)
# The enqueue alone, included before every other router (app/api/main.py): the API's hot path is
# matched first instead of after every system, schedule and move route.
enqueue_router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(read_access)], route_class=EnqueueRoute)


def _reject_nul(value: Any, path: str = "args") -> None:
    """PostgreSQL's jsonb cannot hold U+0000: refuse it up front, naming the field."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidArgsError(f"{path}: text must not contain U+0000", field=path)
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                raise InvalidArgsError(f"{path}: keys must not contain U+0000", field=path)
            _reject_nul(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _reject_nul(item, f"{path}.{index}")


@enqueue_router.post(
    "",
    status_code=201,
    response_model=EnqueuedJob,
    summary="Enqueue a job",
    responses={
        200: {
            "model": EnqueuedJob,
            "description": "An existing job with the same dedup key, or the same unique key (the task's rule).",
        },
        **responses(400, 401, 413, 422, 429),
    },
)
async def enqueue(
    body: EnqueueRequest,
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=MAX_IDEMPOTENCY_KEY,
            description="Dedup key; wins over the body's dedup_key.",
        ),
    ] = None,
) -> Response:
    # Plain requests come straight from EnqueueRoute (enqueue_route.py), the rest through FastAPI.
    st = api_state(request)
    _reject_nul(body.args)
    key = idempotency_key or body.dedup_key
    if key is not None and "\x00" in key:
        raise InvalidOptionError("dedup key must not contain U+0000", field="dedup_key")

    async def announce(job: job_service.Job) -> None:
        await st.events.publish("enqueued", job_id=job.id, queue=job.queue, task=job.task)

    limits = Limits(max_payload_bytes=st.settings.max_payload_bytes)
    options: EnqueueOptions = {
        "queue": body.queue,
        "priority": body.priority,
        "delay": body.delay_seconds,
        "run_at": body.run_at,
        "max_attempts": body.max_attempts,
        "dedup_key": key,
        "keep_result": body.keep_result,
    }
    row = None
    if key is None and not st.settings.max_queue_depth:  # validated here (typed errors, nothing written)
        row = prepare(body.task, body.args, registry=st.registry, limits=limits, **options)
    async with st.pool.connection() as conn:
        if row is not None and row.unique_rule is None:
            if await st.events.wanted():
                job = await _insert_returning_job(conn, row, announce)
            else:
                job = await _insert_alone(conn, row)
            done = job_service.Enqueued(job=job, duplicate=False)
        else:
            try:
                done = await job_service.enqueue(
                    conn,
                    body.task,
                    body.args,
                    registry=st.registry,
                    limits=limits,
                    max_queue_depth=st.settings.max_queue_depth,
                    before_commit=announce,
                    **options,
                )
            except QueueFullError as exc:
                st.metrics.count_enqueued(exc.details["queue"], "queue_full")
                raise
    job = done.job
    st.metrics.count_enqueued(job.queue, "duplicate" if done.duplicate else "created")
    status = 200 if done.duplicate else 201
    if not done.duplicate and log.isEnabledFor(logging.INFO):
        log.info("enqueued", extra={"outbox_id": job.id, "task": job.task, "queue": job.queue})
    encoded = enqueued_json(job, done.duplicate)
    if encoded is None:  # history or progress: the model writes it (FastAPI does not check a Response)
        encoded = EnqueuedJob.model_validate({**as_dict(job), "duplicate": done.duplicate}).model_dump_json().encode()
    return Response(encoded, status_code=status, media_type="application/json")


# The answer's fields in EnqueuedJob's order; all but the last two are the job's own.
ENQUEUED_FIELDS = tuple(EnqueuedJob.model_fields)
JOB_FIELDS = tuple(name for name in ENQUEUED_FIELDS if name not in ("redacted", "duplicate"))


def enqueued_json(job: job_service.Job, duplicate: bool) -> bytes | None:
    """The ``EnqueuedJob`` body of a job without history or progress, the bytes the model would write; else None.

    FastAPI validates a returned dict against the response model before writing it,
    which costs more than the rest of the answer. A job without attempts or progress
    (every new job) holds only JSON-native values and datetimes, which orjson writes
    as pydantic does (``tests/unit/test_api_enqueued_json.py`` compares them). None for
    anything else (history, progress, an integer orjson cannot hold): the model writes it.
    """
    if job.history or job.progress is not None:
        return None
    values = {name: getattr(job, name) for name in JOB_FIELDS}
    values["redacted"] = False
    values["duplicate"] = duplicate
    try:
        return orjson.dumps(values, option=orjson.OPT_UTC_Z)
    except TypeError:  # orjson.JSONEncodeError: e.g. an integer wider than 64 bits in args
        return None


async def _insert_returning_job(
    conn: AsyncConnection[Any], row: JobRow, announce: Callable[[job_service.Job], Awaitable[None]]
) -> job_service.Job:
    """A job with nothing to look up first (no dedup key, no unique rule, no depth limit), in three round trips.

    ``BEGIN``, the insert that returns the job's row (``JOB_INSERT_RETURNING_JOB``),
    the ``enqueued`` event (sent while someone listens), ``COMMIT``: the general
    path (``job_service.enqueue``) reads the row back with a fourth.
    """
    async with conn.transaction():
        job = await _inserted(conn, row)
        await announce(job)  # before COMMIT: the enqueued event precedes the relay's published
    return job


async def _insert_alone(conn: AsyncConnection[Any], row: JobRow) -> job_service.Job:
    """The same job when nobody listens for its ``enqueued`` event: the insert is the whole transaction.

    One statement in autocommit (atomic by itself), one round trip: no BEGIN, no
    COMMIT, no event to send between them. The connection goes back to the pool
    as it came (not autocommit).
    """
    await conn.set_autocommit(True)
    try:
        return await _inserted(conn, row)
    finally:
        if not conn.broken:  # a broken connection is discarded by the pool
            await conn.set_autocommit(False)


async def _inserted(conn: AsyncConnection[Any], row: JobRow) -> job_service.Job:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql.active().JOB_INSERT_RETURNING_JOB, row.params())
    found = await cur.fetchone()
    assert found is not None  # INSERT ... RETURNING without ON CONFLICT: one row
    return job_service.Job(**job_service.job_fields(found, []))


@router.get("", response_model=JobPage, summary="List jobs, newest first", responses=responses(400, 401, 422))
async def list_jobs(
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    queue: QueueFilter = None,
    task: TaskFilter = None,
    state: StateFilter = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    contents: bool = Contents,
) -> dict[str, Any]:
    page = await job_service.list_jobs(conn, queue=queue, task=task, state=state, limit=limit, cursor=cursor)
    return redacted_page(as_dict(page), contents)


@router.get(
    "/{job_id}", response_model=Job, summary="A job with its attempt history", responses=responses(401, 404, 422)
)
async def get_job(
    job_id: JobId, conn: Annotated[AsyncConnection[Any], Depends(db)], contents: bool = Contents
) -> dict[str, Any]:
    return redacted(as_dict(await job_service.get_job(conn, job_id)), contents)


@router.get(
    "/{job_id}/result",
    response_model=JobResult,
    summary="A job's result, waiting up to `wait` seconds for it to finish",
    responses=responses(401, 404, 422),
)
async def get_result(
    job_id: JobId,
    request: Request,
    wait: Annotated[float, Query(ge=0, le=60, description="Seconds to wait for the job to finish.")] = 0,
    contents: bool = Contents,
) -> dict[str, Any]:
    st = api_state(request)
    return redacted(await results.wait_result(st, job_id, wait), contents, ("result",))


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=CancelResult,
    summary="Cancel a job (waiting: now; running: cooperatively)",
    responses=responses(401, 403, 404, 409, 422),
)
async def cancel(
    job_id: JobId,
    request: Request,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
) -> dict[str, Any]:
    st = api_state(request)
    outcome = await job_service.cancel_job(conn, job_id, actor)
    if not outcome.cancel_requested:
        await st.events.publish(
            "cancelled", job_id=job_id, queue=outcome.queue, task=outcome.task, attempt=outcome.attempts
        )
    return as_dict(outcome)
