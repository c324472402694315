"""``bench latency``: enqueue-commit to handler-start, at steady rates.

A relay and one worker process run (concurrency ``--concurrency``); the bench
commits ``bench_probe`` jobs one per transaction at each ``--rate`` for
``--duration`` seconds (after a one-second warm-up at the same rate). With
``--floor``, each run is followed by one of the delivery contract's shortest
path (:mod:`postbox_bench.floor`), reported beside the peers as system ``floor``.  The
handler's first statement writes ``<job id> <time.time()>`` to a file; the
bench has the commit time of each job (``time.time()`` right after COMMIT
returned).  Both clocks are this machine's wall clock.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import psycopg

from postbox_bench import outbox
from postbox_bench.params import Params
from postbox_bench.procs import bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import FLOOR, Figure, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.stats import Latency
from postbox_bench.steady import produce
from postbox_bench.tasks import PROBE_FILE_ENV, read_probes
from postbox_bench.worker import worker_argv

SCENARIO = "latency"
TARGETS = {200: {"p50": Target("<=", 5), "p99": Target("<=", 20)}}


def run(
    box: Sandbox,
    database_url: str,
    params: Params,
    progress: Progress,
    between: Callable[[int, int], None] | None = None,
) -> list[Figure]:
    """The figures at every rate, ``params.repeat`` times; ``between(rep, rate)`` runs after each (the peers')."""
    figures: list[Figure] = []
    for rate in params.rates:
        targets = TARGETS.get(rate, {})
        for name in ("p50", "p95", "p99"):
            figures.append(
                Figure(
                    SCENARIO,
                    f"latency.{name}@{rate}",
                    f"commit-to-handler-start {name} @ {rate}/s",
                    "ms",
                    target=targets.get(name),
                    higher_is_better=False,
                )
            )
    for rate in params.rates:
        figures.append(Figure(SCENARIO, f"latency.offered@{rate}", f"offered rate achieved (asked {rate}/s)", "jobs/s"))
    by_key = {f.key: f for f in figures}
    floor_figures: dict[str, Figure] = {}
    if params.extra.get("floor"):  # the contract's shortest path, right after each of postbox's runs
        for rate in params.rates:
            for name in ("p50", "p95", "p99"):
                key = f"latency.{name}@{rate}"
                floor_figures[key] = Figure(
                    SCENARIO, key, by_key[key].label, "ms", system=FLOOR, higher_is_better=False, paired=True
                )
        figures.extend(floor_figures.values())
    folder = Path(tempfile.mkdtemp(prefix="postbox-bench-probe-"))
    with psycopg.connect(database_url) as conn:
        for rep in range(params.repeat):
            for rate in params.rates:
                outbox.reset(conn)
                box.clean_redis_prefix()
                probe = folder / f"probe-{rep}-{rate}.txt"
                env = bench_env(database_url, box.redis_url, box.prefix, **{PROBE_FILE_ENV: str(probe)})
                with children(env) as kids:
                    kids.python("relay", ["postbox.relay", "run"])
                    kids.python("worker", worker_argv(params.concurrency))
                    warm = produce(database_url, "bench_probe", rate, 1.0)
                    wait_started(probe, warm.commits.keys(), kids.check_alive)
                    measured = produce(database_url, "bench_probe", rate, params.duration)
                    starts = wait_started(probe, measured.commits.keys(), kids.check_alive)
                lat = Latency.of([starts[i] - t for i, t in measured.commits.items()])
                for name, value in (("p50", lat.p50), ("p95", lat.p95), ("p99", lat.p99)):
                    by_key[f"latency.{name}@{rate}"].values.append(value)
                by_key[f"latency.offered@{rate}"].values.append(measured.achieved_rate)
                progress.say(
                    f"latency rep {rep + 1}/{params.repeat} @ {rate}/s (achieved {measured.achieved_rate:,.0f}/s): "
                    f"p50 {lat.p50:.2f} ms, p95 {lat.p95:.2f} ms, p99 {lat.p99:.2f} ms"
                )
                probe.unlink(missing_ok=True)
                if floor_figures:
                    from postbox_bench import floor  # it uses this module's wait_started

                    box.clean_redis_prefix()
                    shortest = floor.measure("floor", database_url, box.redis_url, box.prefix, rate, params.duration)
                    for name in ("p50", "p95", "p99"):
                        floor_figures[f"latency.{name}@{rate}"].values.append(getattr(shortest.latency, name))
                    progress.say(
                        f"latency rep {rep + 1}/{params.repeat} @ {rate}/s, the contract's floor: "
                        f"p50 {shortest.latency.p50:.2f} ms, p99 {shortest.latency.p99:.2f} ms"
                    )
                if between is not None:
                    between(rep, rate)
        outbox.reset(conn)
    box.clean_redis_prefix()
    os.rmdir(folder)
    return figures


def wait_started(probe: Path, ids: Iterable[int], check: Callable[[], None]) -> dict[int, float]:
    wanted = set(ids)
    found: dict[int, float] = {}

    def done() -> bool:
        found.clear()
        found.update(read_probes(str(probe)))
        return wanted <= found.keys()

    outbox.wait_until(done, 60, interval=0.1, check=check)
    return found
