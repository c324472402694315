"""The REST enqueue's CPU without HTTP: ``python -m postbox_bench.rest_app {api,bare,bare-outbox,database}``.

``api``, ``bare`` and ``bare-outbox`` call an app as ASGI, in this process,
with the body ``bench rest`` posts (``POST /api/v1/jobs``, 10 requests at a
time, after 200 unmeasured): ``postbox api run``'s app (``POSTBOX_API_KEY``
sent when set, the bench's tasks), the bare route
(:mod:`postbox_bench.bare_api`, its table created), or the bare route running
postbox's enqueue INSERT (its ``--outbox``). It prints the process's CPU per
request (``time.process_time``: the app, psycopg and the event loop; no
uvicorn, no sockets to a client). To
compare two versions of postbox, run it with each on ``PYTHONPATH`` in turn,
A B A B.

``database`` runs, on one autocommit connection, the bare route's INSERT,
postbox's enqueue INSERT (``JOB_INSERT_RETURNING_JOB``) and the same into a
copy of the outbox with only its primary key, in turn, and prints the
PostgreSQL backend's CPU per insert of each (``/proc/<pid>/schedstat``: same
machine only): the database's share of one request, indexes apart.

The database is ``POSTBOX_DATABASE_URL``, migrated; Redis ``POSTBOX_REDIS_URL``.
Rows are left in the outbox (use a database of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, LiteralString

import psycopg

from postbox import sql
from postbox.startup import run_loop
from postbox_bench import bare_api
from postbox_bench.schedules import cpu_seconds

BODY = b'{"task": "bench_noop", "args": {"n": 1}}'
WARMUP = 200
AT_ONCE = 10
PK_ONLY_DDL: LiteralString = (
    "CREATE TABLE IF NOT EXISTS public.bench_outbox_pk"
    " (LIKE postbox.outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY, PRIMARY KEY (id))"
)
BARE_INSERT: LiteralString = "INSERT INTO public.bench_api_rows (task, args) VALUES (%s, %s::jsonb) RETURNING id"


def _scope(key: str | None) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ]
    if key:
        headers.append((b"x-api-key", key.encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/api/v1/jobs",
        "raw_path": b"/api/v1/jobs",
        "query_string": b"",
        "headers": headers,
    }


async def _post(app: Any, key: str | None, statuses: list[int]) -> None:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.Event().wait()  # as a client that stays: nothing in the route waits for this
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(_scope(key), receive, send)


async def _drive(app: Any, key: str | None, requests: int) -> tuple[float, list[int]]:
    """CPU seconds of ``requests`` POSTs, ``AT_ONCE`` at a time, and their statuses."""
    statuses: list[int] = []

    async def lane(count: int) -> None:
        for _ in range(count):
            await _post(app, key, statuses)

    share, extra = divmod(requests, AT_ONCE)
    started = time.process_time()
    await asyncio.gather(*(lane(share + (1 if n < extra else 0)) for n in range(AT_ONCE)))
    return time.process_time() - started, statuses


async def measure_app(kind: str, requests: int) -> float:
    """µs of this process's CPU per enqueue through the app (``api`` or ``bare``); raises on a non-2xx."""
    database_url = os.environ["POSTBOX_DATABASE_URL"]
    if kind in ("bare", "bare-outbox"):
        with psycopg.connect(database_url) as conn:
            conn.execute(bare_api.ROWS_DDL)
        pool_size = int(os.environ.get("POSTBOX_API_POOL_SIZE", "10"))
        app: Any = bare_api.create_app(database_url, pool_size, outbox=kind == "bare-outbox")
        key = None
    else:
        from postbox.app.api.main import create_app
        from postbox.settings import Settings

        settings = Settings(tasks="postbox_bench.tasks")
        app, key = create_app(settings), settings.api_key
    async with app.router.lifespan_context(app):
        await _drive(app, key, WARMUP)
        used, statuses = await _drive(app, key, requests)
    refused = [status for status in statuses if status >= 300]
    if refused:
        raise RuntimeError(f"{len(refused)} requests answered {sorted(set(refused))}")
    return used / requests * 1e6


def measure_database(inserts: int) -> dict[str, float]:
    """µs of PostgreSQL backend CPU per one-statement autocommit insert, of each kind."""
    outbox = sql.active().JOB_INSERT_RETURNING_JOB
    params = {**bare_api.OUTBOX_VALUES, "task": "bench_noop", "args": '{"n":1}'}
    with psycopg.connect(os.environ["POSTBOX_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(bare_api.ROWS_DDL)
        conn.execute(PK_ONLY_DDL)
        runs: dict[str, Callable[[], Any]] = {
            "bare route's INSERT": lambda: conn.execute(BARE_INSERT, ("bench_noop", '{"n":1}')).fetchone(),
            "postbox's enqueue INSERT": lambda: conn.execute(outbox, params).fetchone(),
            "the same, primary key only": lambda: conn.execute(
                outbox.replace('"postbox".outbox', "public.bench_outbox_pk"), params
            ).fetchone(),
        }
        pid = conn.info.backend_pid
        out: dict[str, float] = {}
        for name, run in runs.items():
            for _ in range(50):
                run()
            before = cpu_seconds(pid)
            for _ in range(inserts):
                run()
            out[name] = (cpu_seconds(pid) - before) / inserts * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m postbox_bench.rest_app", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("api", "bare", "bare-outbox", "database"))
    p.add_argument("--requests", type=int, default=1500, help="measured requests or inserts (default 1500)")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    for _ in range(args.repeat):
        if args.what == "database":
            for name, value in measure_database(args.requests).items():
                print(f"{name}: {value:,.0f} µs of backend CPU per insert")
        else:
            value = run_loop(measure_app(args.what, args.requests))
            print(f"{args.what}: {value:,.0f} µs of CPU per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
