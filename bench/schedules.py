"""``bench schedules``: 10,000 periodic jobs due in the same minute, and what idle schedules cost.

One relay process (``python -m postbox.relay run``) leads. Then:

1. **Idle cost.** The leader's CPU time (its threads' scheduler time from ``/proc``) over
   ``IDLE_WINDOW`` seconds with no schedule, then again after 10,000 schedules
   were added that are not due for months (``0 0 1 1 *``). The duty reads no
   schedule that is not due: it asks the database for the earliest next run
   (one indexed ``min()``) at most every 5 s, and sleeps until then.
2. **Due together.** 10,000 schedules, ``* * * * *`` spread over ten time
   zones, are synchronised so that their first occurrence is the next whole
   minute; the bench then waits for ``repeat`` consecutive minutes. For each,
   "enqueued" is when the last of the 10,000 occurrences was committed
   (``schedule_runs`` rows counted every 20 ms; time read with the database's
   ``clock_timestamp()``), and "published" is the latest ``published_at`` of
   their jobs; both in seconds after the occurrence time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg

from postbox import schedule_store
from postbox.occurrences import Timing
from postbox.periodic import Schedule
from postbox_bench.params import Params
from postbox_bench.procs import bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.tasks import QUEUE

SCENARIO = "schedules"
COUNT = 10_000
IDLE_WINDOW = 10.0
ZONES = (
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Los_Angeles",
    "Asia/Tokyo",
    "Asia/Kolkata",
    "Australia/Sydney",
    "America/Sao_Paulo",
    "Africa/Nairobi",
)

COUNT_DUE = """
SELECT count(*), extract(epoch FROM clock_timestamp() - %(at)s::timestamptz)
  FROM postbox.schedule_runs WHERE occurrence = %(at)s
"""
PUBLISHED = """
SELECT count(*), extract(epoch FROM max(o.published_at) - %(at)s::timestamptz)
  FROM postbox.schedule_runs r JOIN postbox.outbox o ON o.id = r.job_id
 WHERE r.occurrence = %(at)s AND o.published_at IS NOT NULL
"""
LEADS = "SELECT count(*) FROM postbox.relays WHERE role = 'leader'"


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``, all its threads (Linux ``/proc``).

    The scheduler's nanosecond count of each thread (``/proc/<pid>/task/*/schedstat``)
    where the kernel keeps it: utime + stime count clock ticks (10 ms), and a short run
    of no-op jobs can fit in one. Else utime + stime.
    """
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                with open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
                    total += int(schedstat.read().split()[0])
        return total / 1e9
    except (FileNotFoundError, IndexError, ValueError):
        pass
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def schedules(prefix: str, cron: str, count: int) -> list[Schedule]:
    return [
        Schedule(
            name=f"{prefix}-{i:05d}",
            task="bench_noop",
            timing=Timing(cron=cron, tz=ZONES[i % len(ZONES)]),
            args={"n": i},
            queue=QUEUE,
        )
        for i in range(count)
    ]


async def sync(url: str, declared: list[Schedule], now: datetime | None = None) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await schedule_store.sync(conn, declared, [], now=now)


def wait(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench schedules: timed out waiting for {what}")
        time.sleep(interval)


def run(box: Sandbox, url: str, params: Params, progress: Progress) -> list[Figure]:
    enqueued = Figure(
        SCENARIO,
        "schedules.due_10k_enqueued",
        f"{COUNT:,} schedules due in one minute: last one enqueued",
        "s late",
        target=Target("<=", 2.0),
        higher_is_better=False,
    )
    published = Figure(
        SCENARIO,
        "schedules.due_10k_published",
        f"{COUNT:,} schedules due in one minute: last one published",
        "s late",
        higher_is_better=False,
    )
    idle_none = Figure(
        SCENARIO,
        "schedules.idle_cpu_none",
        f"leader CPU in {IDLE_WINDOW:g} s, no schedule",
        "ms",
        higher_is_better=False,
    )
    idle_many = Figure(
        SCENARIO,
        "schedules.idle_cpu_10k",
        f"leader CPU in {IDLE_WINDOW:g} s, {COUNT:,} idle schedules",
        "ms",
        higher_is_better=False,
    )
    env = bench_env(url, box.redis_url, box.prefix)
    with psycopg.connect(url, autocommit=True) as conn, children(env) as kids:
        relay = kids.python("relay", ["postbox.relay", "run"])
        wait(lambda: conn.execute(LEADS).fetchone() == (1,), 30, "a leading relay", interval=0.1)
        time.sleep(2.0)  # past start-up work: the window measures the steady idle loop

        def idle_cpu() -> float:
            before = cpu_seconds(relay.pid)
            time.sleep(IDLE_WINDOW)  # the measurement window itself
            return (cpu_seconds(relay.pid) - before) * 1000

        idle_none.values.append(idle_cpu())
        progress.say(f"schedules: leader CPU over {IDLE_WINDOW:g} s with no schedule: {idle_none.values[-1]:.0f} ms")
        asyncio.run(sync(url, schedules("idle", "0 0 1 1 *", COUNT)))
        time.sleep(6.0)  # past the duty's refresh (5 s): it has seen them
        idle_many.values.append(idle_cpu())
        progress.say(f"schedules: ... with {COUNT:,} idle schedules: {idle_many.values[-1]:.0f} ms")

        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        first = (now + timedelta(seconds=70)).replace(second=0, microsecond=0)
        asyncio.run(sync(url, schedules("due", "* * * * *", COUNT), now=first - timedelta(seconds=1)))
        progress.say(f"schedules: {COUNT:,} due every minute from {first:%H:%M:%S} ({len(ZONES)} zones)")
        for rep in range(params.repeat):
            at = first + timedelta(minutes=rep)
            row: list[Any] = [0, 0.0]

            def all_enqueued(at: datetime = at, row: list[Any] = row) -> bool:
                found = conn.execute(COUNT_DUE, {"at": at}).fetchone()
                assert found is not None
                row[:] = [found[0], float(found[1])]
                return bool(found[0] >= COUNT)

            wait(all_enqueued, 130, f"{COUNT} occurrences at {at:%H:%M}", interval=0.05)
            enqueued.values.append(row[1])
            wait(lambda at=at: conn.execute(PUBLISHED, {"at": at}).fetchone()[0] >= COUNT, 60, "published")  # type: ignore[index]
            published_row = conn.execute(PUBLISHED, {"at": at}).fetchone()
            assert published_row is not None
            published.values.append(float(published_row[1]))
            progress.say(
                f"schedules: {at:%H:%M}: all {COUNT:,} enqueued {row[1]:.2f} s, published {published.values[-1]:.2f} s"
                " after their time"
            )
            kids.check_alive()
    return [enqueued, published, idle_none, idle_many]
