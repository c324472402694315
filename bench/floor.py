"""The contract's shortest path, as the floor under ``bench latency``: ``python -m postbox_bench.floor --rate 1000``.

The delivery contract fixes the hops a job takes from its commit to its
handler: the outbox's NOTIFY wakes the relay (carrying the row, for a one-job
insert), the relay XADDs it to Redis Streams, Redis hands the entry to a consumer of the group,
and the worker claims the row in PostgreSQL before the handler runs. This tool
runs two minimal processes that take exactly those hops and nothing else (no
leadership, term or fence, no flow control, retries, metrics, wake-ups over
many streams, fair queues or workflows), with the same producer, the same
probe line and the same statistic as ``bench latency``:

- ``floor``: the relay LISTENs and XADDs the job a notification carries (a
  one-job insert's, postbox's trigger), marking such jobs every 25 ms; on a
  notification without one (a bulk insert) it selects the due rows, XADDs them
  in one pipeline and marks them; the worker blocks in ``XREADGROUP ... >`` (the entry
  comes with the wake-up), claims the batch, writes the probe lines, and records
  the successes and acknowledges in the background.
- ``floor-xread``: the same, but the worker wakes on a plain ``XREAD BLOCK``
  and then reads with ``XREADGROUP`` (two Redis round trips, as postbox's
  worker does today): the difference is what delivering with the wake-up saves.
- ``postbox``: postbox's own relay and worker (``bench latency``'s setup).
- ``postbox-relay``: postbox's relay with the ``floor-xread`` worker reading
  postbox's stream: what postbox's relay adds, apart from its worker.

:func:`drain` runs the ``floor`` pair on a prefilled outbox instead, the floor
under ``bench worker``'s no-op drain (``postbox-bench worker --floor``): the
worker reads as many entries per wake-up as postbox's worker runs at once.
Its ``floor-tasks`` worker (:data:`TASKS`) also runs each claimed job's
handler, a no-op coroutine as ``bench_noop`` is, in an asyncio task of its own
and records the batch's successes once they have ended: the least a worker
of concurrent async handlers does per job (PgQueuer's runs a task per job too).
With ``bench_effect`` jobs (``postbox-bench exactly-once --floor``) the worker
is the ``effect`` one: it keeps as many jobs in flight as postbox's
concurrency, claims each read's batch under its own name, and runs each job's
transaction as postbox's ``ctx.transaction()`` does, with postbox's own
statements (BEGIN with the processed row; the handler's effect row; the fenced
success with COMMIT, each one send) on a connection of its own (as many as
postbox's pool gives its handlers), then acknowledges the finished entries in
the background. What it leaves out is the drain floor's list plus the
worker's per-job bookkeeping (the handler's task, its context, timeouts).

The modes run in turn, ``--repeat`` times, so each repetition is a pair (or a
triple) measured minutes apart at most. A mode's figure is commit → handler
start, p50 and p99 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import redis.asyncio as aioredis
from psycopg import AsyncClientCursor
from redis.exceptions import ResponseError

from postbox import sql, startup
from postbox.relay.notifier import notified_rows
from postbox.settings import Settings
from postbox.streams import GROUP as POSTBOX_GROUP
from postbox.streams import split_meta
from postbox.streams import stream_key as postbox_stream_key
from postbox_bench import outbox
from postbox_bench.latency import wait_started
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.sandbox import sandbox
from postbox_bench.stats import Latency
from postbox_bench.steady import produce
from postbox_bench.tasks import EFFECT_INSERT, PROBE_FILE_ENV, QUEUE
from postbox_bench.worker import worker_argv

MODES = ("floor", "floor-xread", "postbox", "postbox-relay")
EFFECT = "effect"  # the worker of the exactly-once floor (bench_effect jobs), for drain() only
EFFECT_ASYNCPG = "effect-asyncpg"  # the same on asyncpg connections
TASKS = "floor-tasks"  # the drain's worker running each job's no-op handler in a task of its own, for drain() only
GROUP = "floor"
BATCH = 50
MARK_EVERY = 0.025  # seconds between the marks of jobs sent from their notification (as postbox's held marks)
WORKER = "floor"  # the effect worker's name in its claims and fenced successes

SELECT_DUE: LiteralString = """
SELECT id FROM postbox.outbox
 WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
 ORDER BY id LIMIT 1000
"""
# Rows locked in id order first (as postbox's mark and claim do), so the two never deadlock.
MARK: LiteralString = """
WITH l AS (SELECT id FROM postbox.outbox WHERE id = ANY(%s) AND published_at IS NULL ORDER BY id FOR UPDATE)
UPDATE postbox.outbox o SET state = 'queued', published_at = now() FROM l WHERE o.id = l.id
"""
CLAIM: LiteralString = """
WITH l AS (SELECT id FROM postbox.outbox WHERE id = ANY(%s) AND state IN ('pending', 'queued')
            ORDER BY id FOR UPDATE)
UPDATE postbox.outbox o
   SET state = 'running', attempts = o.attempts + 1, started_at = now(), published_at = coalesce(published_at, now())
  FROM l WHERE o.id = l.id
RETURNING o.id
"""
# The effect worker's claim: as CLAIM, under its name, so that postbox's fenced success accepts it.
CLAIM_AS_WORKER: LiteralString = """
WITH l AS (SELECT id FROM postbox.outbox WHERE id = ANY(%s) AND state IN ('pending', 'queued')
            ORDER BY id FOR UPDATE)
UPDATE postbox.outbox o
   SET state = 'running', attempts = o.attempts + 1, claimed_by = 'floor', lease_until = now() + interval '1 hour',
       started_at = now(), published_at = coalesce(published_at, now())
  FROM l WHERE o.id = l.id
RETURNING o.id, o.attempts
"""
RESET_EFFECTS: LiteralString = "TRUNCATE public.bench_effects"
COUNT_EFFECTS: LiteralString = "SELECT count(*) FROM public.bench_effects"
# The path's halves by the rows' timestamps, PostgreSQL's clock (see postbox_bench.phases). A row
# claimed before the relay's mark has published_at = started_at: its relay half includes the claim.
HALVES: LiteralString = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at) * 1000),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - published_at) * 1000)
  FROM postbox.outbox WHERE started_at IS NOT NULL
"""
SUCCEED: LiteralString = """
WITH l AS (SELECT id FROM postbox.outbox WHERE id = ANY(%s) AND state = 'running' ORDER BY id FOR UPDATE)
UPDATE postbox.outbox o SET state = 'succeeded', finished_at = now() FROM l WHERE o.id = l.id
"""


def stream_key(prefix: str) -> str:
    return f"{prefix}floor"


async def relay_main(database_url: str, redis_url: str, prefix: str) -> None:
    """LISTEN; a notification that carries its job: XADD it at once; any other: select the due rows, XADD them.

    A one-job insert's notification carries the job (postbox's outbox trigger), so
    the shortest path sends it without selecting it, as postbox's relay does; the
    marks of such jobs go out every ``MARK_EVERY`` seconds, off the path. A
    notification without a job (a bulk insert) and the start wake the select: one
    pipeline of XADDs, then the mark, as before.
    """
    key = stream_key(prefix)
    redis = aioredis.Redis.from_url(redis_url)
    with contextlib.suppress(ResponseError):  # BUSYGROUP: the worker made it first
        await redis.xgroup_create(key, GROUP, id="0", mkstream=True)
    # synchronous_commit=off on the marking session, as postbox's relay has it
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True, options="-c synchronous_commit=off")
    listener = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    await listener.execute("LISTEN postbox_outbox")
    wake = asyncio.Event()
    wake.set()
    unmarked: list[int] = []  # sent from their notification, not marked yet
    sent: set[int] = set()  # the same, for the select to leave out

    async def listen() -> None:
        async for note in listener.notifies():
            carried = notified_rows([note.payload], "postbox") if note.payload else []
            if not carried:
                wake.set()
                continue
            job_id = carried[0][0]
            await redis.xadd(key, {"id": job_id})
            unmarked.append(job_id)
            sent.add(job_id)

    async def mark_sent() -> None:
        while True:
            await asyncio.sleep(MARK_EVERY)
            if unmarked:
                ids = unmarked[:]
                del unmarked[:]
                await conn.execute(MARK, (ids,))
                sent.difference_update(ids)

    listening = asyncio.ensure_future(listen())
    marking = asyncio.ensure_future(mark_sent())
    try:
        while True:
            try:
                await asyncio.wait_for(wake.wait(), timeout=1.0)
            except TimeoutError:
                pass
            wake.clear()
            rows = await (await conn.execute(SELECT_DUE)).fetchall()
            ids = [row[0] for row in rows if row[0] not in sent]
            if ids:
                async with redis.pipeline(transaction=False) as pipe:
                    for job_id in ids:
                        pipe.xadd(key, {"id": job_id})
                    await pipe.execute()
                await conn.execute(MARK, (ids,))
            if len(rows) == 1000:
                wake.set()
    finally:
        listening.cancel()
        marking.cancel()


async def worker_main(
    database_url: str,
    redis_url: str,
    prefix: str,
    probe: str,
    wake_first: bool,
    on_postbox_stream: bool = False,
    batch: int = BATCH,
    handler_tasks: bool = False,
) -> None:
    """Read (blocking), claim, probe, then succeed + acknowledge in the background.

    ``probe``: the file the start lines go to, or "" for none (a drain). ``on_postbox_stream``: read what
    postbox's relay publishes (``bench_probe``'s stream, postbox's group). ``batch``: entries per read.
    ``handler_tasks``: each claimed job's handler (:func:`noop_handler`) runs in a task of its own, and the
    batch's successes are recorded once every one has ended.
    """
    key = postbox_stream_key(prefix, QUEUE, 5) if on_postbox_stream else stream_key(prefix)
    group = POSTBOX_GROUP if on_postbox_stream else GROUP
    redis = aioredis.Redis.from_url(redis_url)
    claims = await psycopg.AsyncConnection.connect(
        database_url,
        autocommit=True,
        options="-c synchronous_commit=off",  # as postbox's claim commits
    )
    outcomes = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    fd = os.open(probe, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if probe else -1
    with contextlib.suppress(ResponseError):  # BUSYGROUP: the relay made it first
        await redis.xgroup_create(key, group, id="0", mkstream=True)
    # The wake-up reads after the newest entry seen, from the stream's start at first: "$" would miss
    # every entry added before this process first blocked (a slow start can miss the whole warm-up).
    last = "0-0"
    finishing: list[asyncio.Task[None]] = []  # one outcome write in flight at a time, overlapping the next read

    async def finish(ids: list[int], entries: list[bytes]) -> None:
        await outcomes.execute(SUCCEED, (ids,))
        async with redis.pipeline(transaction=False) as pipe:
            pipe.xack(key, group, *entries)
            pipe.xdel(key, *entries)
            await pipe.execute()

    try:
        while True:
            if wake_first:
                woke = await redis.xread({key: last}, count=1, block=1000)
                if not woke:
                    continue
                got = await redis.xreadgroup(group, "c", {key: ">"}, count=batch)
            else:
                got = await redis.xreadgroup(group, "c", {key: ">"}, count=batch, block=1000)
            if not got:
                continue
            entries = got[0][1]
            last = entries[-1][0].decode()
            ids = [job_id_of(fields) for _entry, fields in entries]
            claimed = [row[0] for row in await (await claims.execute(CLAIM, (ids,))).fetchall()]
            if handler_tasks and claimed:
                await asyncio.wait([asyncio.create_task(noop_handler(job_id)) for job_id in claimed])
            if fd >= 0:
                now = time.time()
                os.write(fd, "".join(f"{job_id} {now:.6f}\n" for job_id in claimed).encode())
            if finishing:
                await finishing.pop()
            finishing.append(asyncio.create_task(finish(claimed, [entry for entry, _fields in entries])))
    finally:  # stopped (a signal in its process, a cancel in a test): nothing left open
        for task in finishing:
            task.cancel()
        await asyncio.gather(*finishing, return_exceptions=True)
        await redis.aclose()
        await claims.close()
        await outcomes.close()
        if fd >= 0:
            os.close(fd)


async def noop_handler(job_id: int) -> None:
    """The ``floor-tasks`` worker's handler: nothing, as ``bench_noop``."""
    return None


# The asyncpg floor's texts (effect_worker_main): postbox's processed row, made to fail when processed already.
ASYNCPG_BEGIN: LiteralString = "BEGIN; SELECT 1 / (postbox.begin_processed(%(id)d) IS NOT NULL)::int"
ASYNCPG_SUCCESS: LiteralString = "SELECT postbox.record_success(%(id)d, 'floor', %(attempt)d); COMMIT"
ASYNCPG_EFFECT: LiteralString = "INSERT INTO public.bench_effects (job_id, n) VALUES ($1, 0)"


class _Transactions:
    """The effect worker's connections for its jobs' transactions: each job takes an idle one."""

    def __init__(self, conns: list[Any]) -> None:
        self.idle: asyncio.Queue[Any] = asyncio.Queue()
        for conn in conns:
            self.idle.put_nowait(conn)
        self.conns = conns

    async def run(self, job_id: int, attempt: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


class _PsycopgTransactions(_Transactions):
    """The jobs' transactions on psycopg connections, as postbox's ``ctx.transaction()`` sends them."""

    async def run(self, job_id: int, attempt: int) -> None:
        statements = sql.statements("postbox")  # rendered once (cached)
        conn = await self.idle.get()
        try:
            cur = AsyncClientCursor(conn)
            await cur.execute(statements.PROCESSED_BEGIN_TRANSACTION, {"id": job_id}, prepare=False)
            cur.nextset()  # past BEGIN's
            row = await cur.fetchone()
            if row is None or row[0] is None:  # an earlier run committed it
                await conn.execute("ROLLBACK")
            else:
                await conn.execute(EFFECT_INSERT, {"id": job_id, "n": 0})
                success = {"id": job_id, "worker": WORKER, "attempt": attempt}
                await cur.execute(statements.JOB_RECORD_SUCCESS_AND_COMMIT, success, prepare=False)
        finally:
            self.idle.put_nowait(conn)


class _AsyncpgTransactions(_Transactions):
    """The same three sends per job on asyncpg connections (see :func:`effect_worker_main`)."""

    async def run(self, job_id: int, attempt: int) -> None:
        conn = await self.idle.get()
        try:
            try:
                await conn.execute(ASYNCPG_BEGIN % {"id": job_id})
                await conn.execute(ASYNCPG_EFFECT, job_id)
                await conn.execute(ASYNCPG_SUCCESS % {"id": job_id, "attempt": attempt})
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
        finally:
            self.idle.put_nowait(conn)


async def _transactions(database_url: str, size: int, driver: str) -> _Transactions:
    if driver == "asyncpg":
        asyncpg: Any = importlib.import_module("asyncpg")  # the bench's peers extra (PgQueuer's driver)
        return _AsyncpgTransactions([await asyncpg.connect(database_url) for _ in range(size)])
    if driver != "psycopg":
        raise ValueError(f"the effect floor runs on psycopg or asyncpg, not {driver!r}")
    conns = [await psycopg.AsyncConnection.connect(database_url, autocommit=True) for _ in range(size)]
    return _PsycopgTransactions(conns)


async def effect_worker_main(
    database_url: str, redis_url: str, prefix: str, concurrency: int, driver: str = "psycopg"
) -> None:
    """Up to ``concurrency`` ``bench_effect`` jobs at once, each in its own transaction, as postbox runs them.

    Per read: as many entries as there is room for, claimed in one statement under :data:`WORKER`. Per
    job, on one of ``min(concurrency, 20)`` connections (postbox's pool less its four for claims,
    outcomes and control): ``BEGIN`` with postbox's processed row, the effect row, postbox's fenced
    success with ``COMMIT``, the first and the last one simple query of two statements each, as
    postbox's ``ctx.transaction()`` sends them. Finished entries are acknowledged and deleted in the
    background, whatever has finished since the last acknowledgement, in one pipeline.

    ``driver`` "asyncpg": the jobs' transactions on asyncpg connections instead (PgQueuer's driver), the
    same three sends per job, to tell the driver's cost from the statements'. asyncpg binds no
    parameters in a query of two statements: the job's id and attempt (integers this process read from
    the outbox) are written into the two texts, and a job processed already fails its first statement
    (a division by zero) instead of returning NULL; a clean drain never has one.
    """
    key = stream_key(prefix)
    redis = aioredis.Redis.from_url(redis_url)
    claims = await psycopg.AsyncConnection.connect(database_url, autocommit=True, options="-c synchronous_commit=off")
    transaction = await _transactions(database_url, min(concurrency, 20), driver)
    with contextlib.suppress(ResponseError):  # BUSYGROUP: the relay made it first
        await redis.xgroup_create(key, GROUP, id="0", mkstream=True)
    running: set[asyncio.Task[None]] = set()
    room = asyncio.Event()
    finished: list[bytes] = []
    ready = asyncio.Event()

    async def run(job_id: int, attempt: int, entry: bytes) -> None:
        await transaction.run(job_id, attempt)
        finished.append(entry)
        ready.set()

    failed: list[BaseException] = []  # a job's failure ends the worker (the drain's check reports it)

    def ended(task: asyncio.Task[None]) -> None:
        running.discard(task)
        room.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            failed.append(exc)

    async def acknowledge() -> None:
        while True:
            await ready.wait()
            ready.clear()
            entries = finished[:]
            del finished[:]
            async with redis.pipeline(transaction=False) as pipe:
                pipe.xack(key, GROUP, *entries)
                pipe.xdel(key, *entries)
                await pipe.execute()

    acknowledging = asyncio.ensure_future(acknowledge())
    try:
        while True:
            while len(running) >= concurrency and not failed:
                room.clear()
                await room.wait()
            if failed:
                raise failed[0]
            got = await redis.xreadgroup(GROUP, "c", {key: ">"}, count=concurrency - len(running), block=1000)
            if not got:
                continue
            entries = {job_id_of(fields): entry for entry, fields in got[0][1]}
            rows = await (await claims.execute(CLAIM_AS_WORKER, (list(entries),))).fetchall()
            for job_id, attempt in rows:
                task = asyncio.ensure_future(run(job_id, attempt, entries.pop(job_id)))
                running.add(task)
                task.add_done_callback(ended)
            if entries:  # not claimable (ended already): nothing to run
                finished.extend(entries.values())
                ready.set()
    finally:
        acknowledging.cancel()
        for task in running:
            task.cancel()
        await asyncio.gather(acknowledging, *running, return_exceptions=True)
        await redis.aclose()
        await claims.close()
        await transaction.close()


@dataclass
class Run:
    latency: Latency  # commit -> handler start, ms
    relay_p50: float  # created_at -> published_at (the relay's mark, after its XADD), ms
    worker_p50: float  # published_at -> started_at (the claim), ms


def job_id_of(fields: dict[bytes, bytes]) -> int:
    """The job id of an entry: the floor relay's one field, or postbox's envelope (``postbox-relay`` mode)."""
    meta = fields.get(b"m")
    return int(fields[b"id"]) if meta is None else split_meta(meta)[0]


def measure(mode: str, database_url: str, redis_url: str, prefix: str, rate: float, seconds: float) -> Run:
    """One run of ``mode``: commit → handler start over ``seconds`` at ``rate`` (after a one-second warm-up).

    Also the two halves of the path by the rows' own timestamps (``postbox_bench.phases``), p50.
    """
    probe = Path(tempfile.mkdtemp(prefix="postbox-bench-floor-")) / "probe.txt"
    env = bench_env(database_url, redis_url, prefix, **{PROBE_FILE_ENV: str(probe)})
    try:
        with psycopg.connect(database_url) as conn:
            outbox.reset(conn)
        with children(env) as kids:
            if mode == "postbox":
                kids.python("relay", ["postbox.relay", "run"])
                kids.python("worker", worker_argv(50))
            elif mode == "postbox-relay":
                kids.python("relay", ["postbox.relay", "run"])
                args = [database_url, redis_url, prefix, str(probe), "floor-xread", str(BATCH), "postbox-stream"]
                kids.python("floor-worker", ["postbox_bench.floor", "worker", *args])
            else:
                start_floor(kids, database_url, redis_url, prefix, str(probe), mode, BATCH)
            warm = produce(database_url, "bench_probe", rate, 1.0)
            wait_started(probe, warm.commits.keys(), kids.check_alive)
            measured = produce(database_url, "bench_probe", rate, seconds)
            starts = wait_started(probe, measured.commits.keys(), kids.check_alive)
        with psycopg.connect(database_url) as conn:
            row = conn.execute(HALVES).fetchone()
        assert row is not None
        return Run(Latency.of([starts[i] - t for i, t in measured.commits.items()]), row[0], row[1])
    finally:
        probe.unlink(missing_ok=True)
        probe.parent.rmdir()


def start_floor(
    kids: Children, database_url: str, redis_url: str, prefix: str, probe: str, mode: str, batch: int
) -> tuple[int, int]:
    """The floor's relay and worker processes; pids.

    ``mode`` "floor", "floor-xread" or :data:`TASKS` (``probe`` "" for none), or :data:`EFFECT` (``probe`` "",
    ``batch`` the jobs kept in flight).
    """
    args = [database_url, redis_url, prefix]
    relay = kids.python("floor-relay", ["postbox_bench.floor", "relay", *args])
    worker = kids.python("floor-worker", ["postbox_bench.floor", "worker", *args, probe, mode, str(batch)])
    return relay.process.pid, worker.process.pid


def drain(
    database_url: str,
    redis_url: str,
    prefix: str,
    jobs: int,
    batch: int,
    task: str = "bench_noop",
    driver: str = "psycopg",
    handler_tasks: bool = False,
) -> float:
    """The floor's drain of ``jobs`` rows of ``task``, committed first, then its relay and worker; jobs/s.

    ``task`` "bench_noop" (``bench worker --floor``: ``batch`` entries per read) or "bench_effect"
    (``bench exactly-once --floor``: the :data:`EFFECT` worker, ``batch`` jobs in flight, its jobs'
    transactions on ``driver``'s connections, psycopg or asyncpg; every job's effect row is checked).
    ``handler_tasks``: the no-op drain's :data:`TASKS` worker (each job's handler in a task of its own).
    Timed as ``bench worker`` times postbox (:func:`postbox_bench.worker.drain`): by the rows'
    ``finished_at``, from the first outcome to the last, so process start-up is not counted.
    """
    if task not in ("bench_noop", "bench_effect"):
        raise ValueError(f"the floor drains bench_noop or bench_effect jobs, not {task!r}")
    effect = task == "bench_effect"
    if driver not in ("psycopg", "asyncpg") or (driver == "asyncpg" and not effect):
        raise ValueError(f"the floor's {task} drain runs on psycopg{' or asyncpg' if effect else ''}, not {driver!r}")
    if handler_tasks and effect:
        raise ValueError("the floor's bench_effect worker runs each job's transaction already: no handler_tasks")
    mode = (EFFECT_ASYNCPG if driver == "asyncpg" else EFFECT) if effect else (TASKS if handler_tasks else "floor")
    env = bench_env(database_url, redis_url, prefix)
    with psycopg.connect(database_url) as conn:
        outbox.reset(conn)
        if effect:
            conn.execute(RESET_EFFECTS)
            conn.commit()
        outbox.prefill(conn, task, jobs)
        with children(env) as kids:
            start_floor(kids, database_url, redis_url, prefix, "", mode, batch)
            outbox.wait_until(
                lambda: outbox.scalar(conn, outbox.COUNT_UNFINISHED) == 0,
                timeout=max(120.0, jobs / 100),
                check=kids.check_alive,
            )
        found = outbox.states(conn)
        if found != {"succeeded": jobs}:
            raise RuntimeError(f"the floor's drain: expected {jobs} succeeded jobs, found {found}")
        if effect and (effects := outbox.scalar(conn, COUNT_EFFECTS)) != jobs:
            raise RuntimeError(f"the floor's drain: expected {jobs} effect rows, found {effects}")
        rate = outbox.span(conn, outbox.FINISH_SPAN).rate
        outbox.reset(conn)
        if effect:
            conn.execute(RESET_EFFECTS)
            conn.commit()
    return rate


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["relay"], ["worker"]):
        # As postbox's own processes start (POSTBOX_GC_THRESHOLD): the floor keeps what postbox may do.
        startup.settle_collector(Settings().gc_threshold)
    if argv[:1] == ["relay"]:
        startup.run_loop(relay_main(*argv[1:4]))
        return 0
    if argv[:1] == ["worker"] and argv[5:6] in ([EFFECT], [EFFECT_ASYNCPG]):
        driver = "asyncpg" if argv[5] == EFFECT_ASYNCPG else "psycopg"
        startup.run_loop(effect_worker_main(*argv[1:4], concurrency=int(argv[6]), driver=driver))
        return 0
    if argv[:1] == ["worker"]:
        startup.run_loop(
            worker_main(
                *argv[1:5],
                wake_first=argv[5] == "floor-xread",
                batch=int(argv[6]),
                on_postbox_stream=argv[7:] == ["postbox-stream"],
                handler_tasks=argv[5] == TASKS,
            )
        )
        return 0
    p = argparse.ArgumentParser(prog="python -m postbox_bench.floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="jobs committed per second (default 1000)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (default 5)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, run in turn (default {','.join(MODES)})")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        p.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    results: dict[str, list[Run]] = {m: [] for m in modes}
    with sandbox(os.environ["POSTBOX_DATABASE_URL"], os.environ["POSTBOX_REDIS_URL"]) as box:
        url = box.database()
        for rep in range(args.repeat):
            for mode in modes:
                box.clean_redis_prefix()
                run = measure(mode, url, box.redis_url, box.prefix, args.rate, args.seconds)
                results[mode].append(run)
                print(
                    f"rep {rep + 1} {mode:<12} @ {args.rate:g}/s  p50 {run.latency.p50:6.2f} ms"
                    f"  p99 {run.latency.p99:6.2f} ms  (created -> published p50 {run.relay_p50:.2f},"
                    f" published -> started p50 {run.worker_p50:.2f}; load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        box.clean_redis_prefix()
    print(f"\n{'mode':<12} {'p50 ms (median)':>16} {'p99 ms (median)':>16}   per repetition p50")
    for mode, runs in results.items():
        p50s = sorted(r.latency.p50 for r in runs)
        p99s = sorted(r.latency.p99 for r in runs)
        each = ", ".join(f"{r.latency.p50:.2f}" for r in runs)
        print(f"{mode:<12} {p50s[len(p50s) // 2]:>16.2f} {p99s[len(p99s) // 2]:>16.2f}   {each}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
