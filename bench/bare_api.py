"""The floor ``bench rest`` holds the REST figure to: FastAPI + uvicorn + psycopg-pool doing one INSERT per request.

``python -m postbox_bench.bare_api --port P`` (database from
``POSTBOX_DATABASE_URL``) serves ``POST /api/v1/jobs``: the body validated by
a pydantic model shaped as postbox's enqueue body (``task``, ``args``), one
row (``task``, ``args`` as jsonb) inserted into ``public.bench_api_rows`` on a
connection from an ``AsyncConnectionPool`` as large as ``postbox api run``'s
(``POSTBOX_API_POOL_SIZE``, default 10), autocommit, the new id returned with
201. uvicorn is configured as ``postbox api run`` configures it (its default
loop and HTTP parser, no access log). Nothing else: no API key, no depth
check, no Redis event, no metrics, no audit. What ``postbox api run`` does
beyond this route is what postbox adds; this route's own cost is the
framework's and the driver's.

With ``--outbox`` the route runs postbox's own enqueue statement instead
(``JOB_INSERT_RETURNING_JOB``: one outbox row with its indexes and trigger,
the whole row returned), with the values ``bench_noop`` takes (queue
``bench``, priority 5, five attempts), still one autocommit statement and
nothing else: the same database work as ``POST /api/v1/jobs`` at its
cheapest, so the gap between the two routes is the database's share and the
gap to ``postbox api run`` is postbox's Python.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, LiteralString

import orjson
from fastapi import FastAPI, Request
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from postbox import sql
from postbox.settings import Settings
from postbox.startup import settle_collector

ROWS_DDL: LiteralString = (
    "CREATE TABLE IF NOT EXISTS public.bench_api_rows"
    " (id bigserial PRIMARY KEY, task text NOT NULL, args jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())"
)
COUNT: LiteralString = "SELECT count(*) FROM public.bench_api_rows"
APPLICATION_NAME = "postbox-bench-bare"  # bench rest finds its backends by it
OUTBOX_APPLICATION_NAME = "postbox-bench-bare-outbox"
# What prepare() makes of {"task": "bench_noop", "args": {...}} but the task and args.
OUTBOX_VALUES: dict[str, Any] = {
    "queue": "bench",
    "priority": 5,
    "run_at": None,
    "delay": 0.0,
    "max_attempts": 5,
    "headers": "{}",
    "expires_at": None,
    "timeout": None,
    "keep_result": False,
}
INSERT: LiteralString = "INSERT INTO public.bench_api_rows (task, args) VALUES (%s, %s) RETURNING id"


class Body(BaseModel):
    task: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] = Field(default_factory=dict)


class Created(BaseModel):
    id: int
    task: str


def create_app(database_url: str, pool_size: int, *, outbox: bool = False) -> FastAPI:
    """The bare route; ``outbox``: postbox's enqueue statement instead of the two-column table's INSERT."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            database_url,
            min_size=pool_size,
            max_size=pool_size,
            open=False,
            kwargs={"autocommit": True, "application_name": OUTBOX_APPLICATION_NAME if outbox else APPLICATION_NAME},
        )
        await pool.open(wait=True)
        app.state.pool = pool
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/jobs", status_code=201, response_model=Created)
    async def insert(body: Body, request: Request) -> dict[str, Any]:
        pool: AsyncConnectionPool[AsyncConnection[Any]] = request.app.state.pool
        async with pool.connection() as conn:
            if outbox:
                params = {**OUTBOX_VALUES, "task": body.task, "args": orjson.dumps(body.args).decode()}
                cur = await conn.execute(sql.active().JOB_INSERT_RETURNING_JOB, params)
            else:
                cur = await conn.execute(INSERT, (body.task, Jsonb(body.args)))
            row = await cur.fetchone()
        assert row is not None
        return {"id": row[0], "task": body.task}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m postbox_bench.bare_api", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--outbox", action="store_true", help="insert with postbox's enqueue statement")
    args = p.parse_args(argv)
    pool_size = int(os.environ.get("POSTBOX_API_POOL_SIZE", "10"))
    app = create_app(os.environ["POSTBOX_DATABASE_URL"], pool_size, outbox=args.outbox)
    # The collector as `postbox api run` sets it (POSTBOX_GC_THRESHOLD): a setting any FastAPI app can
    # make, so the floor the REST figure is held to makes it too.
    settle_collector(Settings().gc_threshold)
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False, proxy_headers=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
