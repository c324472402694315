"""The Stagedoor fault test: delivery is at least once, effects happen exactly once.

Real processes on real PostgreSQL and a private Redis: the api, two relays,
three workers and the mail provider (which answers 500 after delivering for
10% of sends).  Orders arrive at a steady rate while we SIGKILL workers,
SIGKILL the leading relay twice, SIGSTOP a worker past the visibility timeout,
FLUSHALL Redis and terminate the workers' database sessions.  Then, once the
system is quiet, every invariant must hold:

- every ticket has its pdf_key; the blob store holds exactly one PDF per order;
- the provider delivered exactly one ticket email per order (counted at the provider);
- each event's seats_sold equals the sum of its orders' seats;
- no job is dead or unfinished; no job's attempts exceed its max_attempts.

``-m soak`` runs the same scenario with 10,000 orders.
"""

from __future__ import annotations

import bisect
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.harness.provider import ProviderProcess, free_port
from tests.harness.redis_server import RedisServer, private_redis
from tests.harness.wait import wait_until

__all__ = ["private_redis"]  # the fixture, used by name

pytestmark = [pytest.mark.system, pytest.mark.alone]  # the email rate, at the provider

# Jobs charged more attempts than allowed: runs interrupted among others (recorded lost,
# error class Interrupted) are counted in attempts but not charged.
OVER_ATTEMPTS = """
SELECT count(*) FROM postbox.outbox o
 WHERE o.attempts - (SELECT count(*) FROM postbox.job_attempts a
                      WHERE a.outbox_id = o.id AND a.outcome = 'lost' AND a.error_class = 'Interrupted')
       > o.max_attempts
"""

VISIBILITY_TIMEOUT = 3.0
CLAIM_TTL = 20.0
# send_tickets declares 50/s; the tests override it below their order rate, so that the
# limit holds emails back through every fault (docs/flow-control.md): 20/s for 25 orders/s
# (the cluster and soak runs), 32/s for the 40 orders/s of the CI run (1,000 orders in 25 s).
EMAIL_RATE = 20
ORDER_RATE = 25.0
FAST_EMAIL_RATE = 32
FAST_ORDER_RATE = 40.0
EVENTS = 5
SEED = 20261129


@dataclass
class Cluster:
    """The postbox processes of one test; everything is killed in :meth:`stop_all`."""

    env: dict[str, str]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    counter: int = 0

    def start(self, kind: str, *args: str) -> str:
        self.counter += 1
        name = f"{kind}-{self.counter}"
        # The example's API (`stagedoor api run`) serves the order routes; relays and workers are postbox's.
        module = "postbox_examples" if kind == "api" else "postbox.app"
        with open(self.logs / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", module, kind, "run", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return name

    def alive(self, kind: str) -> list[str]:
        return [n for n, p in self.procs.items() if n.startswith(kind + "-") and p.poll() is None]

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a stopped process must be able to die
            proc.kill()
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in self.procs.values():
            proc.wait(timeout=10)

    def tail(self, lines: int = 15) -> str:
        out = []
        for name in self.procs:
            text = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()
            out.append(f"--- {name} (exit {self.procs[name].poll()})\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


@pytest.fixture
def cluster(child_env: dict[str, str], private_redis: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(stagedoor_env(child_env, private_redis.url, tmp_path), make_logs(tmp_path))
    try:
        yield found
    finally:
        found.stop_all()


def make_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    return logs


def stagedoor_env(child_env: dict[str, str], redis_url: str, tmp_path: Path) -> dict[str, str]:
    """The processes' environment: the fault test's short timeouts, on ``redis_url``."""
    env = dict(child_env)
    env.update(
        POSTBOX_REDIS_URL=redis_url,
        POSTBOX_TASKS="postbox_examples.stagedoor.tasks",
        POSTBOX_BLOB_DIR=str(tmp_path / "blobs"),
        POSTBOX_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
        POSTBOX_HEARTBEAT_INTERVAL="0.5",
        POSTBOX_RELAY_SESSION_TIMEOUT="2",
        POSTBOX_PROVIDER_TIMEOUT="3",
        # A send interrupted mid-flight leaves a fresh claim that its retry must wait out:
        # 20 s instead of the production 120 s keeps the test short, the logic is the same.
        POSTBOX_STAGEDOOR_CLAIM_TTL=str(CLAIM_TTL),
        POSTBOX_RETRY_BASE_DELAY="0.2",
        POSTBOX_RETRY_MAX_DELAY="2",
        POSTBOX_DRAIN_TIMEOUT="2",
        POSTBOX_CONCURRENCY="4",
        POSTBOX_LOG_LEVEL="WARNING",
    )
    return env


def leader_name(cluster: Cluster, database_url: str) -> str | None:
    pids = {cluster.procs[n].pid: n for n in cluster.alive("relay")}
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM postbox.relays WHERE role = 'leader' ORDER BY last_seen DESC").fetchall()
    for (pid,) in rows:
        if pid in pids:
            return pids[pid]
    return None


def _relays(database_url: str) -> str:
    """The relays' registry rows and the database's sessions (who waits on whom), for a failure's message."""
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            query = "SELECT pid, role, term, last_seen, now() FROM postbox.relays ORDER BY last_seen"
            rows = conn.execute(query).fetchall()
            sessions = conn.execute(SESSIONS).fetchall()
    except psycopg.Error as exc:
        return f"relays: unreadable ({exc})"
    return (
        "relays (pid, role, term, last_seen, now): "
        + "; ".join(str(row) for row in rows)
        + "\nsessions (backend, client port, application, state, wait, blocked by, in transaction for, query):\n"
        + "\n".join(str(row) for row in sessions)
    )


# Every other session of the test's database: a relay whose lock session never goes idle (a statement
# waiting on a lock, an open transaction) keeps the leader lock past idle_session_timeout.
SESSIONS = """
SELECT pid, client_port, application_name, state, wait_event_type || ':' || wait_event,
       pg_blocking_pids(pid), now() - xact_start, left(query, 160)
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
 ORDER BY backend_start
"""


def running_workers(cluster: Cluster, database_url: str, exclude: str | None) -> list[str]:
    """Live worker processes that registered in the workers table (they are consuming)."""
    by_pid = {cluster.procs[n].pid: n for n in cluster.alive("worker") if n != exclude}
    with psycopg.connect(database_url, autocommit=True) as conn:
        pids = {pid for (pid,) in conn.execute("SELECT pid FROM postbox.workers WHERE stopped_at IS NULL").fetchall()}
    return sorted(name for pid, name in by_pid.items() if pid in pids)


def pick_running_worker(rng: random.Random, cluster: Cluster, database_url: str, exclude: str | None) -> str:
    found: list[str] = []

    def some() -> bool:
        found[:] = running_workers(cluster, database_url, exclude)
        return bool(found)

    wait_until(some, 30, interval=0.2, message="a running worker", ignore=(psycopg.OperationalError,))
    return rng.choice(found)


def place_orders(api_url: str, event_ids: list[int], total: int, rate: float, placed: list[dict[str, Any]]) -> None:
    """``total`` orders at ``rate`` per second, each one checked for its 201."""
    rng = random.Random(SEED)
    started = time.monotonic()
    with httpx.Client(base_url=api_url, timeout=30) as client:
        for n in range(total):
            due = started + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the steady load, not waiting for a condition
            body = {"event_id": rng.choice(event_ids), "seats": rng.randint(1, 4), "email": f"fan{n}@example.org"}
            response = client.post("/api/v1/orders", json=body, headers={"X-Request-ID": f"fault-{n}"})
            assert response.status_code == 201, response.text
            placed.append(response.json())


def quiet(database_url: str, jobs_expected: int) -> bool:
    try:
        conn = psycopg.connect(database_url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError:
        return False  # the server is busy (too many clients): ask again at the next poll
    with conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead', 'cancelled', 'expired'))"
            " FROM postbox.outbox"
        ).fetchone()
    assert row is not None
    return bool(row[0] == jobs_expected and row[1] == 0)


def run_fault_scenario(
    database_url: str,
    cluster: Cluster,
    redis_fault: Callable[[], None],
    orders: int,
    rate: float,
    quiet_timeout: float,
    email_rate: float = EMAIL_RATE,
    busiest_deliveries: float | None = None,
) -> None:
    rng = random.Random(SEED)
    provider = ProviderProcess(
        database_url, ["--fail-after-delivery", "0.1", "--seed", str(SEED)], env=cluster.env
    ).start()
    try:
        cluster.env["POSTBOX_PROVIDER_URL"] = provider.url
        with psycopg.connect(database_url, autocommit=True) as conn:  # an operator's override, before any worker
            conn.execute(
                "INSERT INTO postbox.limits (scope, name, override, override_by, override_at)"
                " VALUES ('task', 'send_tickets', %s, 'test', now())",
                (Jsonb({"rate": {"limit": email_rate, "period": 1.0, "burst": 1}}),),
            )
        api_port = free_port()
        cluster.start("api", "--port", str(api_port))
        api_url = f"http://127.0.0.1:{api_port}"
        for _ in range(2):
            cluster.start("relay")
        for _ in range(3):
            cluster.start("worker")
        wait_until(
            lambda: _healthy(api_url), 120, interval=0.2, message="the api", ignore=(psycopg.OperationalError,)
        )  # a busy machine starts it slowly
        event_ids = []
        with httpx.Client(base_url=api_url, timeout=10) as client:
            for n in range(EVENTS):
                created = client.post("/api/v1/events", json={"name": f"Night {n}", "capacity": orders * 4})
                assert created.status_code == 201, created.text
                event_ids.append(created.json()["id"])

        placed: list[dict[str, Any]] = []
        failures: list[BaseException] = []

        def producer() -> None:
            try:
                place_orders(api_url, event_ids, orders, rate, placed)
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        faults = fault_schedule(rng, orders / rate)
        applied: list[str] = []
        started = time.monotonic()
        stopped: str | None = None
        for at, fault in faults:
            delay = started + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the fault timetable: a steady cadence, not a wait for a condition
            if fault == "kill-worker":
                # A worker that is up and working (registered), not one still starting.
                victim = pick_running_worker(rng, cluster, database_url, exclude=stopped)
                cluster.kill(victim)
                cluster.start("worker")
            elif fault == "kill-leader":
                # A deadline that bounds a hang: an election after a Redis fault, with every process and
                # server on two cores, takes seconds. On a timeout: the relays' rows and every log's tail.
                wait_until(
                    lambda: leader_name(cluster, database_url) is not None,
                    60,
                    interval=0.2,
                    message=lambda: f"a leading relay\n{_relays(database_url)}\n{cluster.tail()}",
                    ignore=(psycopg.OperationalError,),
                )
                victim = leader_name(cluster, database_url)
                assert victim is not None
                cluster.kill(victim)
                cluster.start("relay")
            elif fault == "stop-worker":
                stopped = pick_running_worker(rng, cluster, database_url, exclude=None)
                cluster.procs[stopped].send_signal(signal.SIGSTOP)
            elif fault == "cont-worker":
                assert stopped is not None
                cluster.procs[stopped].send_signal(signal.SIGCONT)
                stopped = None
            elif fault == "flushall":
                redis_fault()  # FLUSHALL of the private server; on a cluster, a failover and a node's loss
            elif fault == "terminate-sessions":
                wait_until(
                    lambda: terminate_worker_sessions(database_url) > 0,
                    30,
                    interval=0.2,
                    message="worker sessions to end",
                    ignore=(psycopg.OperationalError,),
                )
            applied.append(fault)
        thread.join(timeout=orders / rate + 120)
        assert not failures, failures
        assert len(placed) == orders
        # A send interrupted mid-flight leaves a fresh claim: its retry comes CLAIM_TTL later.
        try:
            wait_until(
                lambda: quiet(database_url, 3 * orders),
                quiet_timeout,
                interval=1.0,
                message="quiet",
                ignore=(psycopg.OperationalError,),
            )
        except AssertionError:
            raise AssertionError(f"{_states(database_url)}\n{cluster.tail()}") from None
        busiest = email_rate * 1.25 if busiest_deliveries is None else busiest_deliveries
        check_invariants(database_url, cluster, provider, placed, email_rate, busiest)
        assert applied.count("kill-leader") == 2 and "flushall" in applied and "terminate-sessions" in applied
    finally:
        provider.stop()


def flushall(redis_server: RedisServer) -> Callable[[], None]:
    """The scenario's Redis fault on one server: FLUSHALL."""

    def fault() -> None:
        client = redis_server.client()
        try:
            client.flushall()
        finally:
            client.close()

    return fault


def terminate_worker_sessions(database_url: str) -> int:
    """``pg_terminate_backend`` every session of the workers (their pools and the Stagedoor handlers')."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database()"
            " AND (application_name LIKE 'postbox-worker-%' OR application_name = 'postbox-stagedoor')"
        ).fetchone()
        if ended is None or ended[0] == 0:
            seen = conn.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = current_database() GROUP BY 1"
            ).fetchall()
            print(f"no worker session to terminate yet; sessions: {seen}")
            return 0
    return int(ended[0])


def fault_schedule(rng: random.Random, duration: float) -> list[tuple[float, str]]:
    """When each fault happens, in seconds from the first order."""
    plan = [(at, "kill-worker") for at in _every(2.0, duration - 2.0, 3.0, rng)]
    plan += [
        (duration * 0.2, "kill-leader"),
        (duration * 0.3, "stop-worker"),
        (duration * 0.3 + 2.5 * VISIBILITY_TIMEOUT, "cont-worker"),
        (duration * 0.5, "flushall"),
        (duration * 0.65, "kill-leader"),
        (duration * 0.8, "terminate-sessions"),
    ]
    return sorted(plan)


def _every(start: float, stop: float, step: float, rng: random.Random) -> list[float]:
    times, at = [], start
    while at < stop:
        times.append(at)
        at += step * rng.uniform(0.7, 1.3)
    return times


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _states(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT task, state, count(*), max(attempts) FROM postbox.outbox GROUP BY 1, 2 ORDER BY 1, 2"
        )
        return "\n".join(str(r) for r in rows.fetchall())


def check_invariants(
    database_url: str,
    cluster: Cluster,
    provider: ProviderProcess,
    placed: list[dict[str, Any]],
    email_rate: float,
    busiest_deliveries: float,
) -> None:
    order_ids = sorted(int(o["id"]) for o in placed)
    with psycopg.connect(database_url, autocommit=True) as conn:
        db_orders = conn.execute("SELECT id, public_id FROM stagedoor.orders ORDER BY id").fetchall()
        assert [i for i, _ in db_orders] == order_ids
        # Every ticket of every order has its pdf_key, and it is the order's key.
        bad_tickets = conn.execute(
            "SELECT count(*) FROM stagedoor.tickets t JOIN stagedoor.orders o ON o.id = t.order_id"
            " WHERE t.pdf_key IS DISTINCT FROM 'tickets/' || o.public_id || '.pdf'"
        ).fetchone()
        assert bad_tickets == (0,)
        # Seats sold per event = the sum of its orders' seats.
        mismatched = conn.execute(
            "SELECT e.id, e.seats_sold, coalesce(sum(o.seats), 0)"
            " FROM stagedoor.events e LEFT JOIN stagedoor.orders o ON o.event_id = e.id"
            " GROUP BY e.id HAVING e.seats_sold <> coalesce(sum(o.seats), 0)"
        ).fetchall()
        assert mismatched == []
        # No job dead or unfinished; none over its max_attempts; one of each job per order.
        states = conn.execute("SELECT task, state, count(*) FROM postbox.outbox GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        n = len(order_ids)
        assert states == [
            ("render_tickets", "succeeded", n),
            ("send_tickets", "succeeded", n),
            ("update_sales_counter", "succeeded", n),
        ]
        assert conn.execute(OVER_ATTEMPTS).fetchone() == (0,)
        unsent = conn.execute("SELECT count(*) FROM stagedoor.email_sends WHERE sent_at IS NULL").fetchone()
        assert unsent == (0,)
        retried = conn.execute("SELECT count(*) FROM postbox.outbox WHERE attempts > 1").fetchone()
        outcomes = conn.execute(
            "SELECT outcome, coalesce(error_class, ''), count(*) FROM postbox.job_attempts GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    print(f"\nattempt outcomes: {outcomes}")
    # Exactly one PDF per order in the blob store, nothing else.
    blob_dir = Path(cluster.env["POSTBOX_BLOB_DIR"])
    stored = sorted(str(p.relative_to(blob_dir)) for p in blob_dir.rglob("*.pdf"))
    assert stored == sorted(f"tickets/{public_id}.pdf" for _, public_id in db_orders)
    # Exactly one ticket email per order, counted at the provider.
    messages = provider.messages()
    keys = sorted(m["idempotency_key"] for m in messages)
    assert keys == sorted(f"tickets-{i}" for i in order_ids)
    # Sent at the rate limit. Counted at the provider, a second may see a few more than
    # the limit: starts are spaced at least half an interval apart on a schedule one
    # interval apart (docs/flow-control.md), the HTTP call's latency jitters each
    # start-to-delivery gap, and a SIGSTOPped worker's send resumes late.
    sent = sorted(datetime.fromisoformat(m["delivered_at"]).timestamp() for m in messages)
    busiest = max(bisect.bisect_left(sent, t + 1.0) - i for i, t in enumerate(sent))
    span = sent[-1] - sent[0]
    print(f"emails: {len(sent)} in {span:.1f} s, busiest second {busiest} deliveries (limit {email_rate:g}/s)")
    assert busiest <= busiest_deliveries
    assert len(sent) / max(span, 1e-9) <= email_rate * 1.02  # the long-run rate never exceeds the limit
    # The faults were real: the provider failed some sends and was asked again, and jobs were retried.
    replays = sum(m["replays"] for m in messages)
    print(f"provider: {len(messages)} messages, {replays} replays; jobs retried: {retried}")
    assert replays > 0
    assert retried is not None and retried[0] > 0


@pytest.mark.timeout(300)
def test_stagedoor_exactly_once_under_faults(database_url: str, cluster: Cluster, private_redis: RedisServer) -> None:
    orders = int(os.environ.get("STAGEDOOR_FAULT_ORDERS", 1000))
    # The wait for quiet covers the backlog plus one stale-claim period (a send cut mid-flight).
    run_fault_scenario(
        database_url,
        cluster,
        flushall(private_redis),
        orders,
        rate=FAST_ORDER_RATE,
        quiet_timeout=60 + 3 * CLAIM_TTL,
        email_rate=FAST_EMAIL_RATE,
    )


@pytest.mark.soak
@pytest.mark.timeout(2400)
def test_stagedoor_exactly_once_under_faults_soak(
    database_url: str, cluster: Cluster, private_redis: RedisServer
) -> None:
    # 10,000 orders at 25/s: about seven minutes of faults, then the backlog drains.
    run_fault_scenario(database_url, cluster, flushall(private_redis), 10_000, rate=ORDER_RATE, quiet_timeout=1500)
