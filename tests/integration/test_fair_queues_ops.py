"""Fair queues through the REST API and ``postbox queues``: declared, shown with per-key counts, cleared, audited."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from postbox.app.admin import queues_cli
from postbox.settings import Settings
from tests.harness.api import API_KEY, audit_rows, client_fixture, keyed_client_fixture  # noqa: F401

URL = "/api/v1/queues/fairq/fairness"


def jobs(conn: psycopg.Connection[Any], rows: list[tuple[str | None, str]]) -> None:
    """Jobs of fairq straight in SQL: (fair_key, state) each."""
    for key, state in rows:
        conn.execute(
            "INSERT INTO postbox.outbox (queue, task, fair_key, state, published_at)"
            " VALUES ('fairq', 'noop', %s, %s, CASE WHEN %s IN ('queued', 'running') THEN now() END)",
            (key, state, state),
        )
    conn.commit()


def test_the_api_declares_shows_and_clears_a_fair_queue(
    keyed_client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    headers = {"X-API-Key": API_KEY}
    assert keyed_client.put(URL, json={"by": "tenant_id"}).status_code == 401  # destructive: the key
    assert keyed_client.get(URL).status_code == 404  # not fair yet
    put = keyed_client.put(URL, json={"by": "tenant_id", "window": 50}, headers=headers)
    assert put.status_code == 200, put.text
    assert put.json() == {
        "queue": "fairq", "by": "tenant_id", "window": 50, "window_in_force": 50,
        "in_flight": 0, "waiting": 0, "unkeyed": 0, "keys": [],
    }  # fmt: skip
    jobs(conn, [("a", "pending")] * 3 + [("a", "queued"), ("b", "pending"), ("b", "running"), (None, "pending")])
    got = keyed_client.get(URL, params={"keys": 1})
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["waiting"], body["in_flight"], body["unkeyed"]) == (4, 2, 1)
    assert body["keys"] == [{"key": "a", "waiting": 3, "in_flight": 1}]  # the most waiting first
    gone = keyed_client.delete(URL, headers=headers)
    assert gone.status_code == 200 and gone.json() == {"queue": "fairq", "was_fair": True}
    assert keyed_client.delete(URL, headers=headers).json() == {"queue": "fairq", "was_fair": False}
    assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE fair_key IS NOT NULL").fetchone() == (0,)
    conn.commit()
    assert [row[1:3] for row in audit_rows(conn)] == [
        ("queue.fair", "queue:fairq"),
        ("queue.unfair", "queue:fairq"),
    ]


@pytest.mark.parametrize(
    "body",
    [{"by": ""}, {"by": "t", "window": 0}, {"by": "t", "window": "5"}, {"window": 5}, {"by": "t", "other": 1}],
)
def test_a_bad_declaration_is_a_422_and_writes_nothing(
    client: TestClient, conn: psycopg.Connection[Any], body: dict[str, Any]
) -> None:
    got = client.put(URL, json=body)
    assert got.status_code == 422, got.text
    assert conn.execute("SELECT count(*) FROM postbox.fair_queues").fetchone() == (0,)


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)


def test_the_cli_declares_shows_and_clears_a_fair_queue(
    cli_env: None, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert queues_cli.main(["fair", "fairq", "--by", "tenant_id"]) == 0
    assert capsys.readouterr().out.strip() == "queue fairq fair by tenant_id, window 2000"
    jobs(conn, [("t1", "pending"), ("t1", "pending"), ("t2", "queued")])
    assert queues_cli.main(["fairness", "fairq"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "queue fairq: fair by tenant_id, window 2000 (1 in flight, 2 waiting, 0 not keyed yet)"
    assert [line.split() for line in out[1:]] == [["KEY", "WAITING", "IN_FLIGHT"], ["t1", "2", "0"], ["t2", "0", "1"]]
    assert queues_cli.main(["fairness", "fairq", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"][0] == {"key": "t1", "waiting": 2, "in_flight": 0}
    assert queues_cli.main(["fair", "fairq", "--by", "tenant_id", "--window", "0"]) != 0
    assert "window" in capsys.readouterr().err
    assert queues_cli.main(["unfair", "fairq"]) == 0
    assert capsys.readouterr().out.strip() == "queue fairq served in enqueue order"
    assert queues_cli.main(["fairness", "fairq"]) != 0
    actions = [row[1] for row in audit_rows(conn)]
    assert actions == ["queue.fair", "queue.unfair"] and audit_rows(conn)[0][0].startswith("cli:")


def test_the_queue_lists_show_a_fair_queues_window_and_busiest_keys(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    """GET /api/v1/queues (and the dashboard's list, the same answer) carry ``fair``: null for a plain queue."""
    assert client.put(URL, json={"by": "tenant_id", "window": 8}).status_code == 200
    jobs(conn, [("a", "pending")] * 2 + [("b", "queued")])
    conn.execute("INSERT INTO postbox.outbox (queue, task) VALUES ('plainq', 'noop')")
    conn.commit()
    rest = {q["queue"]: q for q in client.get("/api/v1/queues").json()}
    board = {q["queue"]: q for q in client.get("/api/v1/dashboard/queues").json()}
    one = client.get("/api/v1/queues/fairq").json()
    assert rest["plainq"]["fair"] is None and board["plainq"]["fair"] is None
    for shown in (rest["fairq"]["fair"], board["fairq"]["fair"], one["fair"]):
        assert (shown["by"], shown["window_in_force"], shown["in_flight"], shown["waiting"]) == ("tenant_id", 8, 1, 2)
        assert shown["keys"] == [{"key": "a", "waiting": 2, "in_flight": 0}, {"key": "b", "waiting": 0, "in_flight": 1}]
