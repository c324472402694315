"""``stagedoor demo``: the Stagedoor ticket shop, end to end, on one machine.

With no database or Redis URL set, embedded PostgreSQL and Valkey start from
PyPI packages in a local state folder outside the repository (a second run is
fast and keeps its data). Then: migrate; start the api, two relays, two
workers and the mail provider as child processes; place orders at a steady
rate through the REST API; show live progress; stop everything cleanly on
Ctrl-C or SIGTERM, leaving no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
from psycopg import sql as pgsql

from postbox import migrate
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings
from postbox_examples.settings import load_example_settings
from postbox_examples.stagedoor import schema as stagedoor_schema

TASKS_MODULE = "postbox_examples.stagedoor.tasks"
DEMO_DATABASE = "postbox_demo"
STATES = ("pending", "queued", "running", "retrying", "succeeded", "dead", "cancelled", "expired")


EXAMPLE = "postbox_examples"  # the example's own commands: ``python -m postbox_examples``


@dataclass
class Child:
    name: str
    argv: list[str]
    module: str = "postbox.app"  # ``python -m`` this: postbox's own commands, or the example's (postbox_examples)
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Progress:
    placed: int = 0
    rejected: int = 0
    last_succeeded: int = 0
    last_time: float = field(default_factory=time.monotonic)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stagedoor demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=200, help="orders to place (default 200)")
    parser.add_argument("--rate", type=float, default=10.0, help="orders per second (default 10)")
    parser.add_argument("--events", type=int, default=3, help="events to sell tickets for (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--relays", type=int, default=2, help="relay processes (default 2: one leads)")
    parser.add_argument("--api-port", type=int, default=None, help="API port (default POSTBOX_API_PORT)")
    parser.add_argument("--provider-port", type=int, default=None, help="mail provider port (default: free port)")
    parser.add_argument("--state-dir", default=None, help="embedded servers' folder (default: a temp state folder)")
    parser.add_argument("--exit-when-done", action="store_true", help="stop once every order's jobs finished")
    parser.add_argument("--timeout", type=float, default=0, help="with --exit-when-done: give up after N seconds")
    args = parser.parse_args(argv)
    if args.orders < 0 or args.rate <= 0 or args.events < 1 or args.workers < 1 or args.relays < 1:
        parser.error("--orders >= 0, --rate > 0, --events/--workers/--relays >= 1")
    return args


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def ensure_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    return with_database(admin_url, name)


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux)
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_child(child: Child, env: dict[str, str], log_dir: Path) -> None:
    log = (log_dir / f"{child.name}.log").open("ab")
    child.process = subprocess.Popen(
        [sys.executable, "-m", child.module, *child.argv],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches the demo only; it stops children in order
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    log.close()
    print(f"  started {child.name:<10} pid {child.process.pid}", flush=True)


def stop_children(children: list[Child], timeout: float = 15.0) -> None:
    live = [c for c in children if c.process is not None and c.process.poll() is None]
    for child in live:
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    for child in live:
        assert child.process is not None
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait(timeout=5)


async def wait_ready(client: httpx.AsyncClient, url: str, children: list[Child], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for child in children:
            if child.process is not None and child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with code {child.process.returncode} (see its log)")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(url, timeout=2)).status_code == 200:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {limit:.0f}s")


async def place_orders(
    client: httpx.AsyncClient, api: str, args: argparse.Namespace, progress: Progress, stop: asyncio.Event
) -> None:
    event_ids = []
    for number in range(args.events):
        reply = await client.post(
            f"{api}/api/v1/events", json={"name": f"Demo night {number + 1}", "capacity": 100_000}
        )
        reply.raise_for_status()
        event_ids.append(reply.json()["id"])
    rand = random.Random(7)
    start = time.monotonic()
    for index in range(args.orders):
        if stop.is_set():
            return
        due = start + index / args.rate
        delay = due - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
        body = {"event_id": rand.choice(event_ids), "seats": rand.randint(1, 4), "email": f"fan{index}@example.com"}
        reply = await client.post(f"{api}/api/v1/orders", json=body, headers={"X-Request-ID": f"demo-{index}"})
        if reply.status_code == 201:
            progress.placed += 1
        else:
            progress.rejected += 1


def snapshot(conn: psycopg.Connection[Any]) -> tuple[dict[str, dict[str, int]], str | None]:
    counts: dict[str, dict[str, int]] = {}
    for queue, state, count in conn.execute("SELECT queue, state, count(*) FROM postbox.outbox GROUP BY 1, 2"):
        counts.setdefault(queue, dict.fromkeys(STATES, 0))[state] = count
    row = conn.execute(
        "SELECT id FROM postbox.relays WHERE role = 'leader' AND last_seen > now() - interval '30 seconds'"
        " ORDER BY last_seen DESC LIMIT 1"
    ).fetchone()
    return counts, (row[0] if row else None)


def render(
    counts: dict[str, dict[str, int]],
    leader: str | None,
    delivered: int | None,
    progress: Progress,
    args: argparse.Namespace,
    rate: float,
) -> str:
    shown = ("pending", "queued", "running", "retrying", "succeeded", "dead")
    lines = [
        f"orders placed {progress.placed}/{args.orders} (rejected {progress.rejected})"
        f" · leader relay {leader or '-'} · emails delivered {delivered if delivered is not None else '-'}"
        f" · {rate:.1f} jobs/s",
        f"  {'queue':<12}" + "".join(f"{s:>10}" for s in shown),
    ]
    for queue in sorted(counts):
        lines.append(f"  {queue:<12}" + "".join(f"{counts[queue][s]:>10}" for s in shown))
    return "\n".join(lines)


async def delivered_count(client: httpx.AsyncClient, provider: str) -> int | None:
    try:
        reply = await client.get(f"{provider}/v1/messages", timeout=2)
        return len(reply.json()) if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def finished(counts: dict[str, dict[str, int]]) -> bool:
    busy = ("pending", "queued", "running", "retrying")
    return all(counts[q][s] == 0 for q in counts for s in busy)


async def monitor(
    database_url: str,
    provider: str,
    args: argparse.Namespace,
    progress: Progress,
    stop: asyncio.Event,
    placing: asyncio.Task[None],
) -> bool:
    """Print progress every second; return True once all orders are placed and finished."""
    tty = sys.stdout.isatty()
    drawn = 0
    announced = False
    async with httpx.AsyncClient() as client:
        with psycopg.connect(database_url, autocommit=True) as conn:
            while not stop.is_set():
                counts, leader = await asyncio.to_thread(snapshot, conn)
                delivered = await delivered_count(client, provider)
                now = time.monotonic()
                succeeded = sum(c["succeeded"] for c in counts.values())
                rate = (succeeded - progress.last_succeeded) / max(1e-6, now - progress.last_time)
                progress.last_succeeded, progress.last_time = succeeded, now
                text = render(counts, leader, delivered, progress, args, rate)
                if tty:
                    sys.stdout.write(("\x1b[F\x1b[2K" * drawn) + text + "\n")
                    drawn = text.count("\n") + 1
                else:
                    print(text.splitlines()[0], flush=True)
                sys.stdout.flush()
                all_done = placing.done() and progress.placed + progress.rejected >= args.orders and finished(counts)
                if all_done and not announced:
                    announced = True
                    if not tty:
                        print(text, flush=True)
                    print(f"all {progress.placed} orders processed: every job finished", flush=True)
                    if args.exit_when_done:
                        return True
                    print("still running: explore the API, or press Ctrl-C to stop", flush=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
    return False


async def run(args: argparse.Namespace, settings: Settings, database_url: str, redis_url: str, state_dir: Path) -> int:
    from postbox_examples.embedded import free_port

    api_port = args.api_port or settings.api_port
    provider_port = args.provider_port or free_port()
    api = f"http://127.0.0.1:{api_port}"
    provider = f"http://127.0.0.1:{provider_port}"
    log_dir = state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        POSTBOX_DATABASE_URL=database_url,
        POSTBOX_REDIS_URL=redis_url,
        POSTBOX_TASKS=TASKS_MODULE,
        POSTBOX_PROVIDER_URL=provider,
        POSTBOX_STATE_DIR=str(state_dir),
        POSTBOX_API_HOST="127.0.0.1",
        POSTBOX_API_PORT=str(api_port),
        PYTHONUNBUFFERED="1",
    )
    children = [
        Child("provider", ["provider", "run", "--port", str(provider_port), "--database-url", database_url], EXAMPLE)
    ]
    children += [Child(f"relay-{n + 1}", ["relay", "run"]) for n in range(args.relays)]
    children += [Child(f"worker-{n + 1}", ["worker", "run", "--tasks", TASKS_MODULE]) for n in range(args.workers)]
    children.append(Child("api", ["api", "run", "--host", "127.0.0.1", "--port", str(api_port)], EXAMPLE))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    progress = Progress()
    done = signalled = False
    try:
        print("starting processes (logs in " + str(log_dir) + "):", flush=True)
        for child in children:
            start_child(child, env, log_dir)
        async with httpx.AsyncClient() as client:
            await wait_ready(client, f"{api}/ready", children)
            await wait_ready(client, f"{provider}/v1/messages", children)
            print(
                f"\n  API docs   {api}/docs\n  metrics    {api}/metrics\n  mail       {provider}/v1/messages\n",
                flush=True,
            )
            placing = asyncio.create_task(place_orders(client, api, args, progress, stop))
            watch = asyncio.create_task(monitor(database_url, provider, args, progress, stop, placing))
            timeout = args.timeout if args.exit_when_done and args.timeout > 0 else None
            waiter = asyncio.create_task(stop.wait())
            finished_set, _ = await asyncio.wait({watch, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            done = watch in finished_set and watch.result()
            signalled = waiter in finished_set
            stop.set()
            for task in (placing, watch, waiter):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    finally:
        print("stopping processes...", flush=True)
        stop_children(children)
    if args.exit_when_done and not done and not signalled:
        print("stagedoor demo: timed out before every job finished", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        settings = load_settings()
        example = load_example_settings()
    except SettingsError as exc:
        print(f"stagedoor demo: {exc}", file=sys.stderr)
        return 2
    servers = None
    if settings.database_url and settings.redis_url:
        database_url = settings.require_database_url()
        redis_url = settings.require_redis_url()
        state_dir = Path(args.state_dir or example.state_dir or Path.home() / ".local/state/postbox").expanduser()
        print("using the servers from POSTBOX_DATABASE_URL and POSTBOX_REDIS_URL", flush=True)
    elif settings.database_url or settings.redis_url:
        print("stagedoor demo: set both POSTBOX_DATABASE_URL and POSTBOX_REDIS_URL, or neither", file=sys.stderr)
        return 2
    else:
        from postbox_examples.embedded import EmbeddedServers, default_root

        state_dir = Path(args.state_dir or example.state_dir or default_root()).expanduser()
        print(f"starting embedded PostgreSQL and Valkey in {state_dir} ...", flush=True)
        servers = EmbeddedServers(state_dir / "servers", handle_signals=False)
        admin_url, redis_url = servers.start()
        database_url = ensure_database(admin_url, DEMO_DATABASE)
    try:
        migrate.upgrade(database_url)
        stagedoor_schema.migrate(database_url)
        print("database migrated (schemas postbox and stagedoor)", flush=True)
        return asyncio.run(run(args, settings, database_url, redis_url, state_dir))
    finally:
        if servers is not None:
            print("stopping embedded servers...", flush=True)
            servers.stop()
