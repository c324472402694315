"""``postbox-bench <scenario>``: measure postbox (and peers) here.

Scenarios: enqueue, relay, worker, latency (``all`` runs these four), and
schedules, flow, exactly-once, workflow, fair, rest, growth, cluster (each on its own: minutes each;
cluster starts Redis servers of its own).

Runs against the PostgreSQL and Redis named by POSTBOX_DATABASE_URL /
DATABASE_URL and POSTBOX_REDIS_URL / REDIS_URL, in a database and key prefix
of its own that it removes at the end.  With neither set it starts embedded
PostgreSQL and Valkey (:mod:`postbox_examples.embedded`, in ``<tmp>/postbox-<uid>/bench``)
and stops them when it is done; with only one set it refuses.  Progress goes to
stderr; the table (or JSON with ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from postbox.errors import SettingsError
from postbox.settings import load_settings
from postbox_bench import machine
from postbox_bench.params import Params
from postbox_bench.progress import Progress
from postbox_bench.report import Figure, Report, render
from postbox_bench.sandbox import Sandbox, sandbox

if TYPE_CHECKING:
    from postbox_bench.peers import Peer, PeerDrain, PeerLatency
    from postbox_examples.embedded import EmbeddedServers

SCENARIOS = ("enqueue", "relay", "worker", "latency")
# not part of `all`: minutes each
EXTRA_SCENARIOS = ("schedules", "flow", "exactly-once", "workflow", "fair", "rest", "growth", "cluster")
GROWTH_PARTS = ("drain", "queues", "steady", "processes")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _rates(text: str) -> tuple[int, ...]:
    try:
        rates = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of jobs/s, got {text!r}") from None
    if not rates or any(r < 1 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be >= 1 jobs/s, got {text!r}")
    return rates


def _growth_parts(text: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [part for part in parts if part not in GROWTH_PARTS]
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(GROWTH_PARTS)}, got {text!r}")
    return parts


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="postbox-bench", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("scenario", choices=[*SCENARIOS, *EXTRA_SCENARIOS, "all"], help="what to measure")
    p.add_argument("--jobs", type=_positive_int, default=20_000, help="jobs per throughput run (default 20000)")
    p.add_argument(
        "--relay-rows", type=_positive_int, default=100_000, help="pre-filled outbox rows for relay (default 100000)"
    )
    p.add_argument("--concurrency", type=_positive_int, default=50, help="worker concurrency (default 50)")
    p.add_argument(
        "--rate", type=_rates, default=(200, 1000), help="steady rates for latency, jobs/s (default 200,1000)"
    )
    p.add_argument(
        "--flow-rate", type=_positive_int, default=200, help="rate limit of bench flow's rated task, /s (default 200)"
    )
    p.add_argument(
        "--workflow-task",
        choices=("bench_noop", "bench_tx"),
        default="bench_noop",
        help="bench workflow: the jobs' task (bench_tx: each in ctx.transaction(); default bench_noop)",
    )
    p.add_argument(
        "--fair-window",
        type=_positive_int,
        default=None,
        help="bench fair: the fair queue's window (default POSTBOX_FAIR_WINDOW)",
    )
    p.add_argument("--relay-rate", type=_positive_int, default=500, help="steady rate for relay latency (default 500)")
    p.add_argument("--duration", type=_positive_float, default=5.0, help="seconds per timed run (default 5)")
    p.add_argument("--repeat", type=_positive_int, default=3, help="repetitions per figure (default 3)")
    p.add_argument("--batch", type=_positive_int, default=10_000, help="enqueue_many batch size (default 10000)")
    p.add_argument("--peers", action="store_true", help="also run PgQueuer, Procrastinate, arq and SAQ")
    p.add_argument(
        "--peer-config",
        action="append",
        default=[],
        metavar="PEER=CONFIG",
        help="run a peer in one of its configurations (e.g. pgqueuer=5x10; default: the adapter's best)",
    )
    p.add_argument(
        "--peer-only",
        action="append",
        default=[],
        metavar="PEER",
        help="with --peers: run only these peers (repeatable; e.g. --peer-only pgqueuer); default all",
    )
    p.add_argument(
        "--peer-sweep",
        action="store_true",
        help="with --peers and worker: first measure every configuration of every peer, then pair the best",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="latency, worker, exactly-once: also run the delivery contract's shortest path after each"
        " (1-process no-op, or exactly-once) run (postbox_bench.floor)",
    )
    p.add_argument("--requests", type=_positive_int, default=3_000, help="bench rest: POSTs per ab run (default 3000)")
    p.add_argument("--clients", type=_positive_int, default=10, help="bench rest: ab and pgbench clients (default 10)")
    p.add_argument(
        "--big", type=_positive_int, default=1_000_000, help="bench growth drain: the big outbox (default 1000000)"
    )
    p.add_argument(
        "--minutes", type=_positive_int, default=20, help="bench growth steady: minutes at the steady rate (default 20)"
    )
    p.add_argument(
        "--steady-rate", type=_positive_int, default=1_000, help="bench growth steady: jobs/s (default 1000)"
    )
    p.add_argument(
        "--growth",
        type=_growth_parts,
        default=GROWTH_PARTS,
        help=f"bench growth: which parts, comma-separated (default all: {','.join(GROWTH_PARTS)})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


ScenarioRun = Callable[[Sandbox, str, Params, Progress], list[Figure]]


def _scenario(name: str, between: Callable[..., None] | None = None) -> ScenarioRun:
    # Imported on demand: `bench enqueue` needs neither relay nor worker.
    if name == "enqueue":
        from postbox_bench import enqueue

        return lambda box, url, params, progress: enqueue.run(url, params, progress)
    if name == "relay":
        from postbox_bench.relay import run as run_relay

        return run_relay
    if name == "worker":
        from postbox_bench.worker import run as run_worker

        return lambda box, url, params, progress: run_worker(box, url, params, progress, between)
    if name == "latency":
        from postbox_bench.latency import run as run_latency

        return lambda box, url, params, progress: run_latency(box, url, params, progress, between)
    if name == "schedules":
        from postbox_bench.schedules import run as run_schedules

        return run_schedules
    if name == "flow":
        from postbox_bench.flow import run as run_flow

        return run_flow
    if name == "exactly-once":
        from postbox_bench.exactly_once import run as run_exactly_once

        return run_exactly_once
    if name == "workflow":
        from postbox_bench.workflow import run as run_workflow

        return run_workflow
    if name == "fair":
        from postbox_bench.fair import run as run_fair

        return run_fair
    if name == "rest":
        from postbox_bench.rest import run as run_rest

        return run_rest
    if name == "growth":
        from postbox_bench.growth import run as run_growth

        return run_growth
    if name == "cluster":
        from postbox_bench.cluster import run as run_cluster

        return run_cluster
    raise ValueError(f"unknown scenario {name!r}")


def _peer_latencies(latencies: Sequence[PeerLatency]) -> Callable[[int, int], None]:
    """After postbox's latency run of repetition ``rep`` at ``rate`` (and its floor's): each peer's."""

    def run(rep: int, rate: int) -> None:
        for peer_latency in latencies:
            peer_latency.rep(rep, rate)

    return run


def _peer_reps(drains: Sequence[PeerDrain]) -> Callable[[int], None]:
    """After postbox's 1-process run of repetition ``rep``: the same repetition of each peer."""

    def run(rep: int) -> None:
        for drain in drains:
            drain.rep(rep)

    return run


EMBEDDED_NOTE = (
    "servers: embedded PostgreSQL and Valkey (no POSTBOX_DATABASE_URL / POSTBOX_REDIS_URL set),"
    " Valkey with appendonly everysec: figures for trying the bench, not for comparing machines"
)


def _embedded(progress: Progress) -> tuple[EmbeddedServers, str, str]:
    """Embedded PostgreSQL and Valkey for this run, under ``<tmp>/postbox-<uid>/bench`` (apart from the demo's).

    Stopped by :func:`main` on the way out (SIGTERM unwinds there too: :func:`_terminate`);
    after a SIGKILL their watchdog stops them.
    """
    from postbox_examples.embedded import EmbeddedServers, default_root

    root = default_root() / "bench"
    progress.say(f"no POSTBOX_DATABASE_URL / POSTBOX_REDIS_URL: starting embedded PostgreSQL and Valkey in {root}")
    servers = EmbeddedServers(root, handle_signals=False)
    database_url, redis_url = servers.start()
    return servers, database_url, redis_url


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C: children are stopped and the sandbox is dropped on the way out.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    signal.signal(signal.SIGTERM, _terminate)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"postbox-bench: {exc}", file=sys.stderr)
        return 2
    params = Params(
        jobs=args.jobs,
        relay_rows=args.relay_rows,
        concurrency=args.concurrency,
        rates=args.rate,
        relay_rate=args.relay_rate,
        duration=args.duration,
        repeat=args.repeat,
        batch=min(args.batch, args.jobs),
        peers=args.peers,
        extra={
            "flow_rate": args.flow_rate,
            "requests": args.requests,
            "clients": args.clients,
            "big": args.big,
            "minutes": args.minutes,
            "steady_rate": args.steady_rate,
            "growth": args.growth,
            "workflow_task": args.workflow_task,
            "fair_window": args.fair_window,
            "floor": args.floor,
        },
    )
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    if args.peer_only:
        from postbox_bench.peers.registry import PEERS

        if not args.peers:
            print("postbox-bench: --peer-only needs --peers", file=sys.stderr)
            return 2
        unknown = sorted(set(args.peer_only) - set(PEERS))
        if unknown:
            known = ", ".join(PEERS)
            print(f"postbox-bench: --peer-only: unknown peer {unknown[0]!r}; one of {known}", file=sys.stderr)
            return 2
    if args.peer_config or args.peer_sweep:
        from postbox_bench.peers import parse_peer_configs

        if not args.peers:
            print("postbox-bench: --peer-config and --peer-sweep need --peers", file=sys.stderr)
            return 2
        try:
            chosen = parse_peer_configs(args.peer_config)
        except (ValueError, ImportError) as exc:
            print(f"postbox-bench: --peer-config: {exc}", file=sys.stderr)
            return 2
    else:
        chosen = {}
    progress = Progress(quiet=args.quiet)
    servers: EmbeddedServers | None = None
    if settings.database_url and settings.redis_url:
        database_url, redis_url = settings.require_database_url(), settings.require_redis_url()
    elif settings.database_url or settings.redis_url:
        print("postbox-bench: set both POSTBOX_DATABASE_URL and POSTBOX_REDIS_URL, or neither", file=sys.stderr)
        return 2
    else:
        try:
            servers, database_url, redis_url = _embedded(progress)
        except Exception as exc:  # no wheels for this platform, or a server that would not start
            print(
                "postbox-bench: no POSTBOX_DATABASE_URL / POSTBOX_REDIS_URL set and the embedded servers"
                f" did not start ({type(exc).__name__}: {exc}); set both URLs",
                file=sys.stderr,
            )
            return 2
    try:
        return _run(args, params, names, chosen, progress, database_url, redis_url, embedded=servers is not None)
    finally:
        if servers is not None:
            progress.say("stopping the embedded servers")
            servers.stop()


def _run(
    args: argparse.Namespace,
    params: Params,
    names: list[str],
    chosen: dict[str, str],
    progress: Progress,
    database_url: str,
    redis_url: str,
    embedded: bool,
) -> int:
    """Every scenario of ``names`` in a sandbox on these servers; print the report; 1 if one failed."""
    report = Report(machine=machine.describe(database_url, redis_url), parameters=params.describe())
    if embedded:
        report.notes.append(EMBEDDED_NOTE)
    failed = False
    with sandbox(database_url, redis_url) as box:
        progress.say(f"sandbox: database postbox_bench_{box.token}, redis prefix {box.prefix}")
        bench_url = box.database()
        peers: list[Peer] = []
        drains: list[PeerDrain] = []
        latencies: list[PeerLatency] = []
        if params.peers:
            from postbox_bench import peers as peer_runs

            progress.say("peers: installing")
            peers = peer_runs.prepare_peers(box, params, progress, report, chosen, only=args.peer_only)
            if "worker" in names and args.peer_sweep:
                progress.say("peers: configuration sweep")
                peers = peer_runs.sweep(peers, params, progress, report)
            if "worker" in names:
                drains = [peer_runs.PeerDrain(peer, params, progress, report) for peer in peers]
        for name in names:
            progress.say(f"scenario {name}")
            between: Callable[..., None] | None = None
            if name == "worker" and drains:
                for drain in drains:
                    drain.warm_up()
                between = _peer_reps(drains)
            if name == "latency" and peers:
                from postbox_bench import peers as peer_runs

                latencies = [peer_runs.PeerLatency(peer, params, progress, report) for peer in peers]
                between = _peer_latencies(latencies)
            try:
                for figure in _scenario(name, between)(box, bench_url, params, progress):
                    report.add(figure)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # one scenario failing still prints the others
                failed = True
                report.notes.append(f"{name}: failed: {type(exc).__name__}: {exc}")
                progress.say(f"scenario {name} failed: {type(exc).__name__}: {exc}")
        for drain in drains:
            report.add(drain.figure)
        for peer_latency in latencies:
            for figure in peer_latency.close():
                report.add(figure)
        if params.peers and not {"worker", "latency"} & set(names):
            report.notes.append("peers: only the worker and latency scenarios have peer runs")
        # The report first: dropping databases can wait on the server (DROP DATABASE needs
        # every backend of the cluster to answer a barrier), and the figures must not wait with it.
        if args.json:
            print(json.dumps(report.as_dict(), indent=2), flush=True)
        else:
            print(render(report), end="", flush=True)
        progress.say("cleaning up")
    return 1 if failed else 0


def main_argv() -> int:
    """The ``postbox-bench`` command."""
    return main(sys.argv[1:])
