"""``bench relay``: how fast the relay empties a full outbox, and commit-to-XADD latency.

Throughput: ``relay_rows`` jobs are committed first, then one relay process
(``python -m postbox.relay run``) starts; the rate is taken from PostgreSQL's
``published_at`` stamps (rows after the first batch / time from the first
batch's mark to the last one's), so process start-up is not counted.

Latency: a relay runs; the bench commits jobs at a steady ``relay_rate`` (one
per transaction) and a reader thread in the bench process XREADs the stream;
latency = time the entry was read − time the COMMIT returned, both read with
``time.time()`` on this machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
import redis

from postbox.streams import split_meta, stream_key
from postbox_bench import outbox
from postbox_bench.params import Params
from postbox_bench.procs import bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.stats import Latency
from postbox_bench.steady import produce
from postbox_bench.tasks import QUEUE

SCENARIO = "relay"


class StreamReader(threading.Thread):
    """XREADs one stream from its start; records when each outbox id was first seen."""

    def __init__(self, redis_url: str, key: str) -> None:
        super().__init__(daemon=True, name="bench-xread")
        self.client = redis.Redis.from_url(redis_url)
        self.key = key
        self.seen: dict[int, float] = {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        last = "0-0"
        try:
            while not self.stopping.is_set():
                reply: Any = self.client.xread({self.key: last}, count=1000, block=100)
                now = time.time()
                for _key, entries in reply or []:
                    for entry_id, fields in entries:
                        last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                        job_id = split_meta(fields[b"m"])[0]
                        self.seen.setdefault(job_id, now)
        except BaseException as exc:  # reported by the scenario
            self.error = exc
        finally:
            self.client.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)


def wait_seen(reader: StreamReader, ids: Iterable[int], check: Callable[[], None], timeout: float = 60) -> None:
    wanted = set(ids)
    outbox.wait_until(lambda: wanted <= reader.seen.keys(), timeout, interval=0.1, check=check)


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    rows = params.relay_rows
    throughput = Figure(
        SCENARIO, "relay.rows", f"rows/s published ({rows:,} pre-filled)", "rows/s", target=Target(">=", 30_000)
    )
    rate = params.relay_rate
    p50 = Figure(
        SCENARIO, "relay.p50", f"commit-to-XADD p50 @ {rate}/s", "ms", target=Target("<=", 5), higher_is_better=False
    )
    p95 = Figure(SCENARIO, "relay.p95", f"commit-to-XADD p95 @ {rate}/s", "ms", higher_is_better=False)
    p99 = Figure(
        SCENARIO, "relay.p99", f"commit-to-XADD p99 @ {rate}/s", "ms", target=Target("<=", 25), higher_is_better=False
    )
    offered = Figure(SCENARIO, "relay.offered", f"offered rate achieved (asked {rate}/s)", "jobs/s")
    env = bench_env(database_url, box.redis_url, box.prefix)
    with psycopg.connect(database_url) as conn:
        for rep in range(params.repeat):
            outbox.reset(conn)
            box.clean_redis_prefix()
            outbox.prefill(conn, "bench_noop", rows, params.batch)
            with children(env) as kids:
                kids.python("relay", ["postbox.relay", "run"])
                try:
                    outbox.wait_until(
                        lambda: outbox.scalar(conn, outbox.COUNT_UNPUBLISHED) == 0,
                        timeout=max(120.0, rows / 500),
                        interval=0.5,
                        check=kids.check_alive,
                    )
                except TimeoutError:
                    # Measured on what it published in time (a steady rate all the same); the label says so.
                    left = outbox.scalar(conn, outbox.COUNT_UNPUBLISHED)
                    throughput.label += " [a run timed out: rate of the rows published]"
                    progress.say(f"relay rep {rep + 1}: {left:,} rows still unpublished at the deadline")
            span = outbox.span(conn, outbox.PUBLISH_SPAN)
            throughput.values.append(span.rate)
            progress.say(f"relay rep {rep + 1}/{params.repeat}: {span.rate:,.0f} rows/s ({span.count:,} rows)")
        key = stream_key(box.prefix, QUEUE, 5)
        for rep in range(params.repeat):
            outbox.reset(conn)
            box.clean_redis_prefix()
            reader = StreamReader(box.redis_url, key)
            reader.start()
            try:
                with children(env) as kids:
                    kids.python("relay", ["postbox.relay", "run"])
                    warm = produce(database_url, "bench_noop", rate, 1.0)  # relay up and leading, caches warm
                    wait_seen(reader, warm.commits, kids.check_alive)
                    measured = produce(database_url, "bench_noop", rate, params.duration)
                    wait_seen(reader, measured.commits, kids.check_alive)
            finally:
                reader.stop()
            if reader.error is not None:
                raise reader.error
            lat = Latency.of([reader.seen[i] - t for i, t in measured.commits.items()])
            p50.values.append(lat.p50)
            p95.values.append(lat.p95)
            p99.values.append(lat.p99)
            offered.values.append(measured.achieved_rate)
            progress.say(
                f"relay latency rep {rep + 1}/{params.repeat} @ {measured.achieved_rate:,.0f}/s: "
                f"p50 {lat.p50:.2f} ms, p95 {lat.p95:.2f} ms, p99 {lat.p99:.2f} ms"
            )
        outbox.reset(conn)
    box.clean_redis_prefix()
    return [throughput, p50, p95, p99, offered]
