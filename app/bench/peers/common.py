"""What every peer adapter shares: its configuration, the probe, and the adapter shape.

A peer adapter is a module with these coroutines (all take a :class:`PeerConfig`):

- ``install(cfg)``: create its schema (PostgreSQL peers) — once per run;
- ``reset(cfg)``: empty its queue tables / Redis db between runs;
- ``enqueue_bulk(cfg, n) -> list[str]``: ``n`` no-op jobs through its batch API;
- ``produce(cfg, rate, seconds) -> dict[str, float]``: one job at a time at a
  steady rate, job id -> time the enqueue call returned (committed);
- ``remaining(cfg) -> int``: jobs not finished yet;
- ``span(cfg, ids) -> Span``: first/last completion stamps of the run, from
  the peer's own records (its log/events table or stored results);
- ``work(cfg)``: run a worker until killed (in a child process:
  ``python -m app.bench.peers.run <peer>``).

Handlers are no-ops; with ``POSTBOX_BENCH_PROBE_FILE`` set they write
``<job id> <time.time()>`` first, exactly like postbox's ``bench_probe``.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from postbox.app.bench.tasks import PROBE_FILE_ENV

PEER_DB_ENV = "POSTBOX_BENCH_PEER_DB"
PEER_REDIS_ENV = "POSTBOX_BENCH_PEER_REDIS"
PEER_CONCURRENCY_ENV = "POSTBOX_BENCH_PEER_CONCURRENCY"
QUEUE = "bench"


@dataclass(frozen=True)
class PeerConfig:
    database_url: str = ""
    redis_url: str = ""
    concurrency: int = 50

    @classmethod
    def from_env(cls) -> PeerConfig:
        return cls(
            database_url=os.environ.get(PEER_DB_ENV, ""),
            redis_url=os.environ.get(PEER_REDIS_ENV, ""),
            concurrency=int(os.environ.get(PEER_CONCURRENCY_ENV, "50")),
        )

    def env(self) -> dict[str, str]:
        return {
            PEER_DB_ENV: self.database_url,
            PEER_REDIS_ENV: self.redis_url,
            PEER_CONCURRENCY_ENV: str(self.concurrency),
        }


def load(module: str) -> Any:
    """A peer's module, untyped (peers are optional; their types must not bind ours)."""
    return importlib.import_module(module)


class Probe:
    """Writes ``<job id> <start time>`` lines when the probe file is configured (else does nothing)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._checked = False

    def hit(self, job_id: object) -> None:
        started = time.time()
        if not self._checked:
            self._checked = True
            path = os.environ.get(PROBE_FILE_ENV)
            if path:
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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

    Returns job id -> time the enqueue call returned (the job is committed then).
    """
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
