"""What every peer adapter shares: its configuration, the probe, and the adapter shape.

A peer adapter is a module with these coroutines (all take a :class:`PeerConfig`):

- ``install(cfg)``: create its schema (PostgreSQL peers) — once per run;
- ``reset(cfg)``: empty its queue tables / Redis db between runs;
- ``enqueue_bulk(cfg, n) -> list[str]``: ``n`` no-op jobs through its batch API;
- ``produce(cfg, rate, seconds) -> dict[str, float]``: one job at a time at a
  steady rate, job id -> time the enqueue call returned (committed);
- ``remaining(cfg) -> int``: jobs not finished yet (asked once a drain is
  over, to check that the peer acknowledged every job, never while it runs);
- ``work(cfg)``: run a worker until killed (in a child process:
  ``python -m postbox_bench.peers.run <peer>``), in the configuration named by
  ``cfg.variant`` (one of the module's ``CONFIGS``; ``BEST`` when empty).

Handlers are no-ops that call :meth:`Probe.hit`.  With
``POSTBOX_BENCH_PROBE_FILE`` set it writes ``<job id> <time.time()>`` first,
exactly like postbox's ``bench_probe`` (latency runs).  With
``POSTBOX_BENCH_PEER_TALLY`` set (drain runs) it only appends the time to a
list in memory; a daemon thread of the worker process writes ``<count> <first>
<last>`` to that file five times a second.  A drain is thus timed without
asking the peer to write anything it would not write anyway (PgQueuer's log
rows, say) and without polling its tables while it runs.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from postbox_bench.outbox import Span
from postbox_bench.steady import without_gc_pauses
from postbox_bench.tasks import PROBE_FILE_ENV

PEER_DB_ENV = "POSTBOX_BENCH_PEER_DB"
PEER_REDIS_ENV = "POSTBOX_BENCH_PEER_REDIS"
PEER_CONCURRENCY_ENV = "POSTBOX_BENCH_PEER_CONCURRENCY"
PEER_VARIANT_ENV = "POSTBOX_BENCH_PEER_VARIANT"
PEER_TALLY_ENV = "POSTBOX_BENCH_PEER_TALLY"
TALLY_INTERVAL = 0.2  # seconds between two writes of the tally file
QUEUE = "bench"


@dataclass(frozen=True)
class PeerConfig:
    database_url: str = ""
    redis_url: str = ""
    concurrency: int = 50
    variant: str = ""  # one of the adapter's CONFIGS; "" is its BEST

    @classmethod
    def from_env(cls) -> PeerConfig:
        return cls(
            database_url=os.environ.get(PEER_DB_ENV, ""),
            redis_url=os.environ.get(PEER_REDIS_ENV, ""),
            concurrency=int(os.environ.get(PEER_CONCURRENCY_ENV, "50")),
            variant=os.environ.get(PEER_VARIANT_ENV, ""),
        )

    def env(self) -> dict[str, str]:
        return {
            PEER_DB_ENV: self.database_url,
            PEER_REDIS_ENV: self.redis_url,
            PEER_CONCURRENCY_ENV: str(self.concurrency),
            PEER_VARIANT_ENV: self.variant,
        }


def variant_of(cfg: PeerConfig, configs: dict[str, Any], best: str) -> Any:
    """The settings of the configuration ``cfg`` names (its adapter's ``best`` when it names none)."""
    name = cfg.variant or best
    if name not in configs:
        raise ValueError(f"unknown configuration {name!r}; one of {', '.join(configs)}")
    return configs[name]


def load(module: str) -> Any:
    """A peer's module, untyped (peers are optional; their types must not bind ours)."""
    return importlib.import_module(module)


class Tally:
    """Handler runs counted in memory; a daemon thread publishes ``<count> <first> <last>`` to ``path``."""

    def __init__(self, path: str, interval: float = TALLY_INTERVAL) -> None:
        self.path = path
        self.interval = interval
        self.stamps: list[float] = []
        threading.Thread(target=self._publish, name="postbox-bench-tally", daemon=True).start()

    def add(self, stamp: float) -> None:
        self.stamps.append(stamp)  # list.append is atomic under the GIL: no lock on the job's path

    def write(self) -> None:
        stamps = self.stamps
        count = len(stamps)
        if count == 0:
            return
        scratch = f"{self.path}.tmp"
        with open(scratch, "w", encoding="utf-8") as handle:
            handle.write(f"{count} {stamps[0]:.6f} {stamps[count - 1]:.6f}\n")
        os.replace(scratch, self.path)

    def _publish(self) -> None:
        written = 0
        while True:
            time.sleep(self.interval)
            if len(self.stamps) != written:
                written = len(self.stamps)
                self.write()


def read_tally(path: str) -> Span:
    """The drain's span from a tally file: (last - first) seconds over count jobs, the first not counted."""
    try:
        with open(path, encoding="utf-8") as handle:
            parts = handle.read().split()
    except FileNotFoundError:
        return Span(0.0, 0, 0)
    if len(parts) != 3:
        return Span(0.0, 0, 0)
    count, first, last = int(parts[0]), float(parts[1]), float(parts[2])
    return Span(last - first, count, 1)


class Probe:
    """Called first by every peer handler: a latency line in the probe file, or a tally in memory, or nothing."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tally: Tally | None = None
        self._checked = False

    def hit(self, job_id: object) -> None:
        started = time.time()
        if not self._checked:
            self._checked = True
            path = os.environ.get(PROBE_FILE_ENV)
            if path:
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            tally = os.environ.get(PEER_TALLY_ENV)
            if tally:
                self._tally = Tally(tally)
        if self._tally is not None:
            self._tally.add(started)
        if self._fd is not None:
            os.write(self._fd, f"{job_id} {started:.6f}\n".encode())


def read_probe_file(path: str) -> dict[str, float]:
    starts: dict[str, float] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) == 2:
                    starts.setdefault(parts[0], float(parts[1]))
    except FileNotFoundError:
        pass
    return starts


async def paced(
    rate: float, seconds: float, lanes: Sequence[Callable[[int], Awaitable[str | None]]]
) -> dict[str, float]:
    """Open-loop schedule (job ``i`` due at ``start + i / rate``) spread over ``lanes`` enqueue callers.

    Returns job id -> time the enqueue call returned (the job is committed then). The
    collector is held off meanwhile, as in postbox's producer (postbox_bench.steady).
    """
    with without_gc_pauses():
        return await _paced(rate, seconds, lanes)


async def _paced(
    rate: float, seconds: float, lanes: Sequence[Callable[[int], Awaitable[str | None]]]
) -> dict[str, float]:
    total = max(1, int(rate * seconds))
    start = time.perf_counter() + 0.05
    commits: dict[str, float] = {}

    async def run_lane(index: int, call: Callable[[int], Awaitable[str | None]]) -> None:
        for i in range(index, total, len(lanes)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            job_id = await call(i)
            if job_id is not None:
                commits[job_id] = time.time()

    await asyncio.gather(*(run_lane(i, call) for i, call in enumerate(lanes)))
    return commits
