"""The Stagedoor example while its PostgreSQL restarts (fast, then immediate): one email per order.

Real processes on a private PostgreSQL (tests/harness/postgres_server.py): the
Stagedoor API, two relays, two workers; the mail provider keeps its own table
elsewhere (it is a third party, it does not restart with us). Orders arrive at
a steady rate while PostgreSQL is restarted with ``-m fast`` and then crashed
with ``-m immediate``. An order whose request failed during a restart may or may
not exist (its transaction's fate is PostgreSQL's answer, not ours): the orders
in the database are the truth, and every order there must end with its tickets
rendered once, exactly one email at the provider, and its seats counted once.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from postbox import migrate
from postbox_examples.stagedoor import schema as stagedoor_schema
from tests.harness.postgres_server import PostgresServer, running_postgres
from tests.harness.provider import ProviderProcess, free_port
from tests.harness.wait import wait_until
from tests.system.test_stagedoor_faults import Cluster

pytestmark = pytest.mark.system

# Jobs charged more attempts than allowed: runs interrupted among others (recorded lost,
# error class Interrupted) are counted in attempts but not charged.
OVER_ATTEMPTS = """
SELECT count(*) FROM postbox.outbox o
 WHERE o.attempts - (SELECT count(*) FROM postbox.job_attempts a
                      WHERE a.outbox_id = o.id AND a.outcome = 'lost' AND a.error_class = 'Interrupted')
       > o.max_attempts
"""

ORDERS = 300
RATE = 25.0
CLAIM_TTL = 10.0


@pytest.fixture
def stagedoor_pg() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        migrate.upgrade(server.url())
        stagedoor_schema.migrate(server.url())
        yield server


def place_orders(api_url: str, event_ids: list[int], placed: list[int], refused: list[int]) -> None:
    """``ORDERS`` orders at ``RATE`` per second; a request that fails is not retried (its fate is unknown)."""
    rng = random.Random(20261130)
    started = time.monotonic()
    with httpx.Client(base_url=api_url, timeout=10) as client:
        for n in range(ORDERS):
            delay = started + n / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the steady load, not waiting for a condition
            body = {"event_id": rng.choice(event_ids), "seats": rng.randint(1, 4), "email": f"fan{n}@example.org"}
            try:
                response = client.post("/api/v1/orders", json=body)
            except httpx.HTTPError:
                refused.append(n)
                continue
            if response.status_code == 201:
                placed.append(int(response.json()["id"]))
            else:
                assert response.status_code in (500, 503), response.text  # the database was down: nothing else
                refused.append(n)


def quiet(url: str) -> bool:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM stagedoor.orders) * 3 = count(*),"
            " count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead', 'cancelled', 'expired')) = 0"
            " FROM postbox.outbox"
        ).fetchone()
    return row == (True, True)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(300)
def test_stagedoor_exactly_one_email_per_order_across_postgres_restarts(
    stagedoor_pg: PostgresServer, database_url: str, child_env: dict[str, str], tmp_path: Path
) -> None:
    url = stagedoor_pg.url()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(
        child_env,
        POSTBOX_DATABASE_URL=url,
        POSTBOX_TASKS="postbox_examples.stagedoor.tasks",
        POSTBOX_BLOB_DIR=str(tmp_path / "blobs"),
        POSTBOX_VISIBILITY_TIMEOUT="3",
        POSTBOX_HEARTBEAT_INTERVAL="0.5",
        POSTBOX_RELAY_SESSION_TIMEOUT="2",
        POSTBOX_PROVIDER_TIMEOUT="3",
        POSTBOX_STAGEDOOR_CLAIM_TTL=str(CLAIM_TTL),  # a send cut mid-flight is retried after this
        POSTBOX_RETRY_BASE_DELAY="0.2",
        POSTBOX_RETRY_MAX_DELAY="2",
        POSTBOX_DRAIN_TIMEOUT="2",
        POSTBOX_CONCURRENCY="4",
        POSTBOX_LOG_LEVEL="WARNING",
    )
    provider = ProviderProcess(database_url, env=env).start()  # its table lives on the shared server
    procs = Cluster(dict(env, POSTBOX_PROVIDER_URL=provider.url), logs)
    try:
        api_port = free_port()
        procs.start("api", "--port", str(api_port))
        api_url = f"http://127.0.0.1:{api_port}"
        for kind in ("relay", "relay", "worker", "worker"):
            procs.start(kind)
        wait_until(lambda: healthy(api_url), 30, message="the api", ignore=(psycopg.OperationalError,))
        with httpx.Client(base_url=api_url, timeout=10) as client:
            event_ids = []
            for n in range(3):
                created = client.post("/api/v1/events", json={"name": f"Night {n}", "capacity": ORDERS * 4})
                assert created.status_code == 201, created.text
                event_ids.append(created.json()["id"])
        placed: list[int] = []
        refused: list[int] = []
        thread = threading.Thread(target=place_orders, args=(api_url, event_ids, placed, refused), daemon=True)
        thread.start()
        wait_until(lambda: len(placed) >= 75, 60, message="75 orders placed", ignore=(psycopg.OperationalError,))
        stagedoor_pg.restart("fast")
        wait_until(lambda: len(placed) >= 150, 60, message="75 more orders placed", ignore=(psycopg.OperationalError,))
        stagedoor_pg.restart("immediate")
        thread.join(timeout=ORDERS / RATE + 60)
        assert not thread.is_alive()
        assert refused, "no request failed: the restarts did not happen under load"
        try:
            last_order = time.monotonic()
            wait_until(
                lambda: quiet(url),
                60 + 3 * CLAIM_TTL,
                interval=0.5,
                message="every order's jobs finished",
                ignore=(psycopg.OperationalError,),
            )
            waited = time.monotonic() - last_order
        except AssertionError:
            raise AssertionError(procs.tail()) from None
        print(f"\n{len(placed)} orders placed, {len(refused)} requests failed during restarts; quiet {waited:.1f}s "
              "after the last order")  # fmt: skip
        assert [p.poll() for p in procs.procs.values()] == [None] * 5  # nobody restarted
        check(url, placed, provider, Path(env["POSTBOX_BLOB_DIR"]))
    finally:
        procs.stop_all()
        provider.stop()


def check(url: str, placed: list[int], provider: ProviderProcess, blob_dir: Path) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        orders: list[tuple[Any, ...]] = conn.execute(
            "SELECT id, public_id FROM stagedoor.orders ORDER BY id"
        ).fetchall()
        ids = [i for i, _ in orders]
        assert set(placed) <= set(ids)  # every order the API confirmed exists
        bad_tickets = conn.execute(
            "SELECT count(*) FROM stagedoor.tickets t JOIN stagedoor.orders o ON o.id = t.order_id"
            " WHERE t.pdf_key IS DISTINCT FROM 'tickets/' || o.public_id || '.pdf'"
        ).fetchone()
        assert bad_tickets == (0,)
        mismatched = conn.execute(
            "SELECT e.id FROM stagedoor.events e LEFT JOIN stagedoor.orders o ON o.event_id = e.id"
            " GROUP BY e.id HAVING e.seats_sold <> coalesce(sum(o.seats), 0)"
        ).fetchall()
        assert mismatched == []
        states = conn.execute("SELECT task, state, count(*) FROM postbox.outbox GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        n = len(ids)
        assert states == [
            ("render_tickets", "succeeded", n),
            ("send_tickets", "succeeded", n),
            ("update_sales_counter", "succeeded", n),
        ]
        assert conn.execute(OVER_ATTEMPTS).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM stagedoor.email_sends WHERE sent_at IS NULL").fetchone() == (0,)
    stored = sorted(str(p.relative_to(blob_dir)) for p in blob_dir.rglob("*.pdf"))
    assert stored == sorted(f"tickets/{public_id}.pdf" for _, public_id in orders)
    keys = sorted(m["idempotency_key"] for m in provider.messages())
    assert keys == sorted(f"tickets-{i}" for i in ids)  # exactly one email per order, counted at the provider
