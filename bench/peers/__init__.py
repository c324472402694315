"""Peers through the same workloads, same servers, same invocation: PgQueuer, Procrastinate, arq, SAQ.

For each peer (its package installed with ``make bench``, ``pip install -e './bench[peers]'``):

- ``worker`` scenario → no-op jobs/s for ``--jobs`` jobs enqueued with the
  peer's bulk API before one worker process (``python -m
  postbox_bench.peers.run <peer>``) starts, timed by the handler's in-memory
  tally (first handler run to last: ``common.Tally``), so the peer does no
  work for the bench while it drains.  The repetitions alternate with
  postbox's (:class:`PeerDrain`, called by ``bench worker`` after each of its
  1-process runs), after one unmeasured warm-up drain each, so that each
  postbox/peer ratio compares runs made a minute apart at most.  Each peer
  runs in one configuration (its adapter's ``BEST``, or ``--peer-config
  PEER=NAME``); ``--peer-sweep`` first measures every configuration of every
  peer (``sweep``, unpaired figures) and pairs the best of each with postbox;
- ``latency`` scenario → enqueue-to-handler-start p50/p95/p99 at each
  ``--rate``, with the same probe file and the same open-loop producer; each
  repetition and rate runs right after postbox's (:class:`PeerLatency`, called
  by ``bench latency``), so the ratios are paired.

Figures share postbox's keys, so the report prints postbox/peer ratios.
PostgreSQL peers get a database each; Redis peers an empty Redis db number each.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from postbox_bench.outbox import Span, wait_until
from postbox_bench.params import Params
from postbox_bench.peers.common import PEER_TALLY_ENV, PeerConfig, read_probe_file, read_tally
from postbox_bench.peers.pgqueuer_peer import shape as pgqueuer_shape
from postbox_bench.peers.registry import PEERS, adapter
from postbox_bench.procs import Children, bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Report
from postbox_bench.sandbox import Sandbox
from postbox_bench.stats import Latency
from postbox_bench.tasks import PROBE_FILE_ENV

T = TypeVar("T")
PEER_DRAIN_BUDGET = 60.0  # seconds a peer may take to drain --jobs before it is measured on what it finished
WARMUP_JOBS = 1_000  # the unmeasured first drain of each peer
WARMUP_BUDGET = 15.0  # seconds it may take (a slow peer is not drained)
ACK_BUDGET = 30.0  # seconds for the peer to acknowledge the jobs its handler ran
PG_PEERS = {"pgqueuer", "procrastinate"}


def sync(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def start_worker(
    kids: Children, name: str, cfg: PeerConfig, probe: Path | None = None, tally: Path | None = None
) -> None:
    extra = cfg.env()
    if probe is not None:
        extra[PROBE_FILE_ENV] = str(probe)
    if tally is not None:
        extra[PEER_TALLY_ENV] = str(tally)
    kids.python(f"{name}-worker", ["postbox_bench.peers.run", name], extra)


def wait_probed(probe: Path, ids: Iterable[str], check: Callable[[], None]) -> dict[str, float]:
    wanted = set(ids)
    found: dict[str, float] = {}

    def done() -> bool:
        found.clear()
        found.update(read_probe_file(str(probe)))
        return wanted <= found.keys()

    wait_until(done, 120, interval=0.1, check=check)
    return found


@dataclass(frozen=True)
class Peer:
    """One installed peer: its adapter module, its own database or Redis db, its children's env."""

    name: str
    module: ModuleType
    cfg: PeerConfig
    env: dict[str, str]

    @property
    def variant(self) -> str:
        return self.cfg.variant or str(self.module.BEST)

    @property
    def label(self) -> str:
        """The peer and its configuration, as the report names it: ``pgqueuer [1x50]``."""
        return f"{self.name} [{self.variant}]"

    def configured(self, variant: str) -> Peer:
        return replace(self, cfg=replace(self.cfg, variant=variant))


def parse_peer_configs(items: Iterable[str]) -> dict[str, str]:
    """``["pgqueuer=2x25", ...]`` -> {peer: configuration}; a bad item raises ValueError."""
    chosen: dict[str, str] = {}
    for item in items:
        name, sep, variant = item.partition("=")
        if not sep or not variant:
            raise ValueError(f"expected PEER=CONFIG, got {item!r}")
        configs = adapter(name).CONFIGS  # an unknown peer raises here
        if name == "pgqueuer":
            pgqueuer_shape(PeerConfig(variant=variant))  # any "MxB" is a PgQueuer configuration
        elif variant not in configs:
            raise ValueError(f"unknown configuration {variant!r} for {name}; one of {', '.join(configs)}")
        chosen[name] = variant
    return chosen


def prepare_peers(
    box: Sandbox,
    params: Params,
    progress: Progress,
    report: Report,
    variants: dict[str, str] | None = None,
    only: Iterable[str] = (),
) -> list[Peer]:
    """Every peer (or those ``only`` names) that imports and installs, in the configuration ``variants`` names.

    A failure becomes a note.
    """
    wanted = set(only)
    ready = []
    for name in PEERS:
        if wanted and name not in wanted:
            continue
        try:
            module = adapter(name)
            if name in PG_PEERS:
                cfg = PeerConfig(database_url=box.database(name, migrated=False), concurrency=params.concurrency)
            else:
                cfg = PeerConfig(redis_url=box.redis_db(), concurrency=params.concurrency)
            sync(module.install(cfg))
            cfg = replace(cfg, variant=(variants or {}).get(name, ""))
            ready.append(Peer(name, module, cfg, bench_env("", "", box.prefix)))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one peer failing (or not installed) still prints the others
            report.notes.append(f"peer {name}: failed: {type(exc).__name__}: {exc}")
            progress.say(f"peer {name} failed: {type(exc).__name__}: {exc}")
    return ready


class PeerDrain:
    """A peer's no-op throughput figure, one repetition per call, paired with postbox's."""

    def __init__(self, peer: Peer, params: Params, progress: Progress, report: Report, *, paired: bool = True) -> None:
        self.peer = peer
        self.params = params
        self.progress = progress
        self.report = report
        self.failed = False
        self.figure = Figure(
            "worker",
            "worker.noop_1p",
            f"no-op jobs/s, 1 worker process ({params.jobs:,} jobs)",
            "jobs/s",
            system=peer.label,
            paired=paired,
        )
        self.folder = Path(tempfile.mkdtemp(prefix=f"postbox-bench-{peer.name}-"))

    def warm_up(self) -> None:
        """One unmeasured drain: the peer's tables, files and code paths are warm for rep 1, as postbox's are."""
        jobs = min(WARMUP_JOBS, self.params.jobs)
        self._guarded(lambda: self._drain(jobs, WARMUP_BUDGET))
        if not self.failed:
            self.progress.say(f"peer {self.peer.label} warm-up run done ({jobs:,} jobs, {WARMUP_BUDGET:.0f} s at most)")

    def rep(self, index: int) -> None:
        self._guarded(lambda: self._measure(index))

    def _guarded(self, step: Callable[[], object]) -> None:
        if self.failed:
            return
        try:
            step()
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # this peer is done; postbox and the other peers go on
            self.failed = True
            self.figure.paired = False
            name = self.peer.label
            self.report.notes.append(f"peer {name}: worker run failed: {type(exc).__name__}: {exc}")
            self.progress.say(f"peer {name} failed: {type(exc).__name__}: {exc}")

    def _drain(self, jobs: int, budget: float) -> Span:
        """Enqueue ``jobs`` in bulk, run one worker until its handler ran them all or ``budget`` passes.

        Returns the handler's tally.  Nothing is asked of the peer while it drains; once every
        job ran, its own count of unfinished jobs must reach 0 (every job acknowledged).
        """
        peer, cfg = self.peer.module, self.peer.cfg
        sync(peer.reset(cfg))
        sync(peer.enqueue_bulk(cfg, jobs))
        tally = self.folder / "tally.txt"
        tally.unlink(missing_ok=True)
        with children(self.peer.env) as kids:
            start_worker(kids, self.peer.name, cfg, tally=tally)
            try:
                wait_until(lambda: read_tally(str(tally)).count >= jobs, budget, interval=0.1, check=kids.check_alive)
            except TimeoutError:
                return read_tally(str(tally))
            wait_until(lambda: sync(peer.remaining(cfg)) == 0, ACK_BUDGET, check=kids.check_alive)
        return read_tally(str(tally))

    def _measure(self, index: int) -> None:
        name, params = self.peer.label, self.params
        span = self._drain(params.jobs, PEER_DRAIN_BUDGET)
        if span.count < params.jobs:
            # A slow peer is measured on what it finished within the budget (its steady rate).
            self.progress.say(f"peer {name}: {span.count:,} of {params.jobs:,} jobs done in {PEER_DRAIN_BUDGET:.0f} s")
            if "slow peers" not in self.figure.label:  # keeps the rest of the label (a sweep's, say)
                self.figure.label = self.figure.label.replace(
                    " jobs)", f" jobs; slow peers: {PEER_DRAIN_BUDGET:.0f} s)", 1
                )
        if span.count < 2:
            raise RuntimeError(f"{name}: {span.count} of {params.jobs} jobs ran")
        self.figure.values.append(span.rate)
        self.progress.say(f"peer {name} worker rep {index + 1}/{params.repeat}: {span.rate:,.0f} jobs/s")


def sweep(peers: list[Peer], params: Params, progress: Progress, report: Report) -> list[Peer]:
    """Every configuration of every peer (warm-up, then ``repeat`` drains); each peer in its best one.

    The figures are reported unpaired (they ran before postbox's); the returned peers are
    configured with their best median, for the paired runs that follow.
    """
    best = []
    for peer in peers:
        drains = []
        for variant in peer.module.CONFIGS:
            drain = PeerDrain(peer.configured(variant), params, progress, report, paired=False)
            drain.figure.key = "worker.noop_1p.sweep"
            drain.figure.label += ", configuration sweep (unpaired)"
            drain.warm_up()
            for rep in range(params.repeat):
                drain.rep(rep)
            report.add(drain.figure)
            if drain.figure.values:
                drains.append(drain)
        if drains:
            top = max(drains, key=lambda d: d.figure.spread.median)
            progress.say(f"peer {peer.name}: best configuration {top.peer.variant}")
            best.append(top.peer)
        else:
            best.append(peer)
    return best


class PeerLatency:
    """A peer's commit-to-start figures, one repetition and rate per call, paired with postbox's.

    ``bench latency`` calls :meth:`rep` right after its own run (and its floor's) of the
    same repetition and rate, so each postbox/peer ratio compares runs made seconds apart:
    a machine whose speed drifts within the hour (docs/benchmarks.md, twelfth round) moves
    both sides of a pair alike.
    """

    def __init__(self, peer: Peer, params: Params, progress: Progress, report: Report) -> None:
        self.peer = peer
        self.params = params
        self.progress = progress
        self.report = report
        self.failed = False
        self.figures = {
            (rate, q): Figure(
                "latency",
                f"latency.{q}@{rate}",
                f"commit-to-handler-start {q} @ {rate}/s",
                "ms",
                system=peer.name,
                higher_is_better=False,
                paired=True,
            )
            for rate in params.rates
            for q in ("p50", "p95", "p99")
        }
        self.folder = Path(tempfile.mkdtemp(prefix=f"postbox-bench-{peer.name}-"))

    def rep(self, index: int, rate: int) -> None:
        if self.failed:
            return
        try:
            self._measure(index, rate)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # this peer is done; postbox and the other peers go on
            self.failed = True
            for figure in self.figures.values():
                figure.paired = False
            self.report.notes.append(f"peer {self.peer.name}: latency run failed: {type(exc).__name__}: {exc}")
            self.progress.say(f"peer {self.peer.name} failed: {type(exc).__name__}: {exc}")

    def _measure(self, index: int, rate: int) -> None:
        peer, name, cfg = self.peer.module, self.peer.name, self.peer.cfg
        sync(peer.reset(cfg))
        probe = self.folder / f"probe-{index}-{rate}.txt"
        try:
            with children(self.peer.env) as kids:
                start_worker(kids, name, cfg, probe)
                warm = sync(peer.produce(cfg, rate, 1.0))
                wait_probed(probe, warm.keys(), kids.check_alive)
                commits = sync(peer.produce(cfg, rate, self.params.duration))
                starts = wait_probed(probe, commits.keys(), kids.check_alive)
        finally:
            probe.unlink(missing_ok=True)
        lat = Latency.of([starts[i] - t for i, t in commits.items()])
        for q, value in (("p50", lat.p50), ("p95", lat.p95), ("p99", lat.p99)):
            self.figures[(rate, q)].values.append(value)
        self.progress.say(
            f"peer {name} latency rep {index + 1}/{self.params.repeat} @ {rate}/s: "
            f"p50 {lat.p50:.2f} ms, p95 {lat.p95:.2f} ms, p99 {lat.p99:.2f} ms"
        )

    def close(self) -> list[Figure]:
        """The figures, for the report; the probe folder goes."""
        shutil.rmtree(self.folder, ignore_errors=True)
        return list(self.figures.values())
