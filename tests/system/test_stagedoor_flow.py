"""Stagedoor end to end through real processes: api -> outbox -> relay -> worker -> provider."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from postbox.producer import enqueue
from postbox_examples.stagedoor.tasks import render_tickets
from tests.harness.provider import ProviderProcess, free_port
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


@pytest.fixture
def stack(database_url: str, child_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, Any]]:
    env = dict(child_env, POSTBOX_TASKS="postbox_examples.stagedoor.tasks", POSTBOX_BLOB_DIR=str(tmp_path / "blobs"))
    provider = ProviderProcess(database_url, env=env).start()
    env["POSTBOX_PROVIDER_URL"] = provider.url
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for args in (
            ["postbox_examples", "api", "run", "--port", str(port)],
            ["postbox.app", "relay", "run"],
            ["postbox.app", "worker", "run"],
        ):
            with open(tmp_path / f"{args[0]}.log", "wb") as log:
                procs.append(
                    subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=log, stderr=subprocess.STDOUT)
                )
        api = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{api}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, interval=0.1, message="the api")
        yield {"api": api, "provider": provider, "blobs": tmp_path / "blobs"}
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
        provider.stop()


def all_succeeded(database_url: str, expected: int) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'succeeded') FROM postbox.outbox"
        ).fetchone()
    return row == (expected, expected)


def test_orders_flow_to_one_pdf_and_one_email_each(database_url: str, stack: dict[str, Any]) -> None:
    api, provider = stack["api"], stack["provider"]
    with httpx.Client(base_url=api, timeout=10) as client:
        event = client.post("/api/v1/events", json={"name": "Premiere", "capacity": 10}).json()
        orders = [
            client.post(
                "/api/v1/orders",
                json={"event_id": event["id"], "seats": n, "email": f"guest{n}@example.org"},
                headers={"X-Request-ID": f"flow-{n}"},
            ).json()
            for n in (1, 2, 3)
        ]
        refused = client.post("/api/v1/orders", json={"event_id": event["id"], "seats": 5, "email": "late@example.org"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "NOT_ENOUGH_SEATS"
    # A duplicate render job for the first order: the conditional UPDATE lets only one queue the email.
    with psycopg.connect(database_url) as conn, conn.transaction():
        enqueue(conn, render_tickets, {"order_id": orders[0]["id"]})
    wait_until(lambda: all_succeeded(database_url, 3 * 3 + 1), 60, interval=0.1, message="every job to succeed")

    messages = provider.messages()
    assert sorted((m["idempotency_key"], m["to"]) for m in messages) == sorted(
        (f"tickets-{o['id']}", o["email"]) for o in orders
    )
    blobs = sorted(p.name for p in stack["blobs"].rglob("*.pdf"))
    assert blobs == sorted(f"{o['public_id']}.pdf" for o in orders)
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT seats_sold FROM stagedoor.events WHERE id = %s", (event["id"],)).fetchone() == (6,)
        headers = conn.execute(
            "SELECT args->>'order_id', headers->>'request_id'"
            " FROM postbox.outbox WHERE task = 'send_tickets' ORDER BY 1"
        ).fetchall()
    # The request id travels from the order request to the jobs it caused, and on to the email job.
    assert headers == sorted((str(o["id"]), f"flow-{o['seats']}") for o in orders)
