"""``/api/v1/dashboard``: the reads the dashboard needs beyond the REST resources.

The overview's last hour, queue counts that use the (queue, state) index, the
job search (time range, text match on args), the bounded count behind "select
all matching", and one job with its headers. They
follow the API's read policy; the args (and a text search in them) follow its
contents policy, as ``GET /api/v1/jobs/{id}`` does.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import definitions
from postbox.app.api.errors import ApiError, responses
from postbox.app.api.params import Cursor, JobId, Limit, QueueFilter, StateFilter, TaskFilter
from postbox.app.api.state import (
    Contents,
    Processes,
    api_state,
    db,
    read_access,
    redacted,
    redacted_page,
    redacted_process,
)
from postbox.app.dashboard import queries
from postbox.app.dashboard.search import BULK_MAX, CREATION_SLACK, TEXT_MAX, TEXT_WINDOW, JobFilter
from postbox.app.services import fairness as fairness_service
from postbox.app.services import jobs as job_service
from postbox.app.services import limits as limit_service
from postbox.app.services import queues as queue_service
from postbox.app.services import workers as worker_service
from postbox.app.services.checks import decode_cursor, encode_cursor
from postbox.app.services.results import as_dict
from postbox.settings import QUEUE_NAME_RE

router = APIRouter(prefix="/dashboard", tags=["dashboard"], dependencies=[Depends(read_access)])
Conn = Annotated[AsyncConnection[Any], Depends(db)]
# Bounds this far out are left to the created_at condition alone (widening them would overflow).
EARLIEST = datetime(2, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 1, 1, tzinfo=UTC)
COUNT_FIELDS = ("backlog", "scheduled", "queued", "in_flight", "retrying", "dead", "discarded")


def job_filter(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    state: StateFilter = None,
    discarded: Annotated[bool | None, Query(description="Dead letters: only discarded (true) or not (false).")] = None,
    since: Annotated[datetime | None, Query(description="Created at or after (ISO 8601 with zone).")] = None,
    until: Annotated[datetime | None, Query(description="Created before (ISO 8601 with zone).")] = None,
    text: Annotated[
        str | None, Query(min_length=1, max_length=TEXT_MAX, description="A substring of the args' JSON.")
    ] = None,
    contents: bool = Contents,
) -> JobFilter:
    """The filter of a search, a count or a bulk action; a text match needs the right to read args."""
    if text is not None and not contents:
        raise ApiError(403, "FORBIDDEN", "a text match on args needs the API key (args are redacted without it)")
    return JobFilter(queue=queue, task=task, state=state, discarded=discarded, since=since, until=until, text=text)


Filter = Annotated[JobFilter, Depends(job_filter)]


async def id_at(cur: Any, at: datetime) -> int:
    """The first id created at or after ``at`` (see ID_AT)."""
    await cur.execute(queries.active().ID_AT, {"at": at})
    row = await cur.fetchone()
    return int(row[0] if isinstance(row, tuple) else next(iter(row.values())))


async def match_params(cur: Any, found: JobFilter) -> dict[str, Any]:
    """The filter's parameters, with every queue name when it names a state but no queue (see QUEUE_NAMES),
    and its creation-time bounds as an id range (see ID_AT), widened by ``CREATION_SLACK``."""
    params = found.params()
    params["queues"] = None
    await cur.execute(queries.active().NO_JIT)
    since, until = found.since, found.until
    params["id_from"] = None if since is None or since < EARLIEST else await id_at(cur, since - CREATION_SLACK)
    params["id_below"] = None if until is None or until > LATEST else await id_at(cur, until + CREATION_SLACK)
    if found.state is not None and found.queue is None:
        await cur.execute(queries.active().QUEUE_NAMES)
        params["queues"] = [row[0] if isinstance(row, tuple) else row["queue"] for row in await cur.fetchall()]
    return params


async def newest_id(cur: Any) -> int:
    await cur.execute(queries.active().NEWEST_ID)
    row = await cur.fetchone()
    return int(row[0] if isinstance(row, tuple) else next(iter(row.values()))) if row else 0


def window_floor(top: int, params: dict[str, Any]) -> int | None:
    """The lowest id a text match below ``top`` reads (``TEXT_WINDOW`` ids), or None when the window
    reaches the bottom of the filter's id range (the whole range is read)."""
    floor = top - TEXT_WINDOW
    if floor <= 1 or (params["id_from"] is not None and floor <= params["id_from"]):
        return None
    return floor


async def text_window(cur: Any, found: JobFilter, params: dict[str, Any]) -> int | None:
    """For a count or a bulk action with a text match: limit ``params`` to the newest window of the
    filter's id range, as the first page of its search reads. Returns the window's floor (None: all read)."""
    if found.text is None:
        return None
    floor = window_floor(params["id_below"] or await newest_id(cur) + 1, params)
    if floor is not None:
        params["id_from"] = floor
    return floor


@router.get(
    "/jobs",
    summary="Jobs matching a filter, newest first (a text match looks at a window of ids per page)",
    responses=responses(400, 401, 403, 422),
)
async def search(
    conn: Conn, found: Filter, limit: Limit = 50, cursor: Cursor = None, contents: bool = Contents
) -> dict[str, Any]:
    """A page of matches. With a text match, at most ``TEXT_WINDOW`` ids below the cursor are read:
    ``searched_down_to`` is the lowest id looked at, and ``next_cursor`` goes on below it."""
    before = decode_cursor(cursor)
    floor = None
    async with conn.cursor(row_factory=dict_row) as cur:
        params = await match_params(cur, found)
        if found.text is not None:
            top = before if before is not None else await newest_id(cur) + 1
            if params["id_below"] is not None:
                top = min(top, params["id_below"])
            floor = window_floor(top, params)
        await cur.execute(queries.active().SEARCH, {**params, "before": before, "floor": floor, "limit": limit + 1})
        rows = await cur.fetchall()
    items = [as_dict(job_service.job_summary(r)) for r in rows[:limit]]
    if len(rows) > limit:
        next_cursor: str | None = encode_cursor(int(items[-1]["id"]))
    elif floor is not None:
        next_cursor = encode_cursor(floor)  # nothing more in this window: go on below it
    else:
        next_cursor = None
    searched = floor if floor is not None and len(rows) <= limit else None
    page = {"items": items, "next_cursor": next_cursor, "searched_down_to": searched}
    return redacted_page(page, contents)


@router.get(
    "/jobs/count",
    summary=f"How many jobs match a filter (exact up to {BULK_MAX}, then 'more'; a text match: in the newest window)",
    responses=responses(400, 401, 403, 422),
)
async def count(conn: Conn, found: Filter) -> dict[str, Any]:
    """With a text match only the newest ``TEXT_WINDOW`` ids of the filter are read (a text match reads
    every row it passes): ``searched_down_to`` is then the lowest id counted, older jobs are not."""
    async with conn.cursor() as cur:
        params = await match_params(cur, found)
        searched = await text_window(cur, found, params)
        await cur.execute(queries.active().COUNT_CAPPED, {**params, "limit": BULK_MAX + 1})
        row = await cur.fetchone()
    total = int(row[0]) if row else 0
    return {"count": min(total, BULK_MAX), "more": total > BULK_MAX, "limit": BULK_MAX, "searched_down_to": searched}


@router.get("/jobs/{job_id}", summary="A job with its headers and history", responses=responses(401, 404, 422))
async def job(job_id: JobId, conn: Conn, contents: bool = Contents) -> dict[str, Any]:
    item = as_dict(await job_service.get_job(conn, job_id))
    async with conn.cursor() as cur:
        await cur.execute(queries.active().HEADERS, {"id": job_id})
        row = await cur.fetchone()
    item["headers"] = row[0] if row else {}
    return redacted(item, contents, ("args", "result", "headers"))


async def queue_stats(request: Request, conn: AsyncConnection[Any]) -> list[dict[str, Any]]:
    """What ``GET /api/v1/queues`` answers, every known queue, counted one queue at a time.

    Queues known from their rows (any state), the queues table, the published task definitions and the registry.
    """
    st = api_state(request)
    q = queries.active()
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q.NO_JIT)
        await cur.execute(q.QUEUE_COUNTS)
        counts = {r["queue"]: r for r in await cur.fetchall()}
        await cur.execute(q.QUEUE_ROWS)
        paused = {r["name"]: bool(r["paused"]) for r in await cur.fetchall()}
    known = await definitions.known_queues(conn, st.registry)
    names = sorted(set(counts) | set(paused) | {n for n in known if QUEUE_NAME_RE.match(n)})
    await queue_service.end_read(conn)  # not across the Redis calls
    streams, redis_error = await queue_service.stream_counts(st.redis, st.settings.redis_prefix, names)
    out = []
    for name in names:
        row = counts.get(name, {})
        in_streams, pending = streams.get(name, (None, None))
        out.append(
            {
                "queue": name,
                "paused": paused.get(name, False),
                **{field: int(row.get(field) or 0) for field in COUNT_FIELDS},
                "oldest_waiting_seconds": row.get("oldest_waiting_seconds"),
                "in_streams": in_streams,
                "stream_pending": pending,
                "redis_error": redis_error,
            }
        )
    limits = await limit_service.queue_limits(conn)  # as GET /api/v1/queues: its flow-control limits
    fair = await fairness_service.by_queue(conn, default_window=st.settings.fair_window)  # and its fairness
    for item in out:
        item["limits"] = [as_dict(x) for x in limits.get(str(item["queue"]), [])]
        item["fair"] = as_dict(fair[str(item["queue"])]) if str(item["queue"]) in fair else None
    return out


@router.get("/queues", summary="Every queue's stats (as GET /api/v1/queues)", responses=responses(401))
async def list_queues(request: Request, conn: Conn) -> list[dict[str, Any]]:
    return await queue_stats(request, conn)


@router.get("/overview", summary="Queues, the last hour, relays and workers", responses=responses(401))
async def overview(request: Request, conn: Conn, hosts: bool = Processes) -> dict[str, Any]:
    st = api_state(request)
    q = queries.active()
    queues = await queue_stats(request, conn)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q.FINISHED_PER_MINUTE)
        minutes = await cur.fetchall()
        await cur.execute(q.LATENCY)
        latency = await cur.fetchone()
        await cur.execute(q.RELAYS)
        relays = await cur.fetchall()
        await cur.execute(q.RELAY_LAG)
        lag = await cur.fetchone()
    workers = await worker_service.list_workers(conn, heartbeat_interval=st.settings.heartbeat_interval)
    return {
        "queues": queues,
        "last_hour": [
            {"minute": m["minute"], "succeeded": m["succeeded"], "dead": m["dead"], "other": m["other"]}
            for m in minutes
        ],
        "latency": {
            "jobs": int(latency["jobs"]) if latency else 0,
            "p50_seconds": latency["p50"] if latency else None,
            "p95_seconds": latency["p95"] if latency else None,
        },
        "relays": [redacted_process(dict(relay), hosts) for relay in relays],
        "relay_lag_seconds": lag["lag_seconds"] if lag else None,
        "unpublished_due": int(lag["unpublished"]) if lag else 0,
        "unpublished_more": bool(lag and int(lag["unpublished"]) > 10_000),
        "workers": {
            "live": sum(1 for w in workers if not w.stale and not w.stopped),
            "stale": sum(1 for w in workers if w.stale),
            "stopped": sum(1 for w in workers if w.stopped),
        },
    }
