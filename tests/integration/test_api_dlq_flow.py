"""The whole dead-letter flow through the API, with the real relay and worker processes.

A job dies, is listed and shown, is requeued and succeeds; another is discarded and
stays visible as discarded; purge needs confirm. The WebSocket sees one job's events in order.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.harness.api import client_fixture, running_fleet  # noqa: F401
from tests.harness.wait import wait_until


def _state(client: TestClient, job_id: int) -> str:
    return str(client.get(f"/api/v1/jobs/{job_id}").json()["state"])


def test_dead_letter_flow_end_to_end(client: TestClient, child_env: dict[str, str], tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    with running_fleet(child_env, tmp_path / "logs") as fleet:
        r = client.post(
            "/api/v1/jobs", json={"task": "api_needs_file", "args": {"path": str(flag)}, "keep_result": True}
        )
        assert r.status_code == 201
        job = r.json()["id"]
        try:
            wait_until(lambda: _state(client, job) == "dead", 30)
        except AssertionError:
            raise AssertionError(fleet.logs()) from None

        listed = client.get("/api/v1/dlq", params={"queue": "apiq"}).json()["items"]
        assert [j["id"] for j in listed] == [job]
        shown = client.get(f"/api/v1/dlq/{job}").json()
        assert shown["last_error_class"] == "PermanentError"
        assert str(flag) in shown["last_error"]
        assert [(h["life"], h["attempt"], h["outcome"]) for h in shown["history"]] == [(1, 1, "dead")]

        flag.write_text("here")
        requeued = client.post(f"/api/v1/dlq/{job}/requeue")
        assert requeued.status_code == 200 and requeued.json()["attempts"] == 0
        result = client.get(f"/api/v1/jobs/{job}/result", params={"wait": 30}).json()
        assert (result["state"], result["finished"], result["result"]) == ("succeeded", True, "found")
        history = client.get(f"/api/v1/jobs/{job}").json()["history"]
        assert [(h["life"], h["attempt"], h["outcome"]) for h in history] == [(1, 1, "dead"), (2, 1, "succeeded")]
        assert client.get("/api/v1/dlq").json()["items"] == []

        other = client.post("/api/v1/jobs", json={"task": "api_needs_file", "args": {"path": str(tmp_path / "no")}})
        other_id = other.json()["id"]
        wait_until(lambda: _state(client, other_id) == "dead", 30)
        assert client.post(f"/api/v1/dlq/{other_id}/discard").status_code == 200
        still = client.get("/api/v1/dlq").json()["items"]
        assert [(j["id"], j["discarded"]) for j in still] == [(other_id, True)]
        assert client.get(f"/api/v1/dlq/{other_id}").json()["discarded"] is True

        refused = client.post("/api/v1/dlq/purge", params={"queue": "apiq"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "CONFIRMATION_REQUIRED"
        assert client.get(f"/api/v1/jobs/{other_id}").status_code == 200
        purged = client.post("/api/v1/dlq/purge", params={"queue": "apiq", "confirm": True})
        assert purged.json() == {"queue": "apiq", "purged": 1}
        assert client.get(f"/api/v1/jobs/{other_id}").status_code == 404
        assert client.get(f"/api/v1/jobs/{job}").json()["state"] == "succeeded"


def test_websocket_receives_one_jobs_events_in_order(
    client: TestClient, child_env: dict[str, str], tmp_path: Path
) -> None:
    received: queue.Queue[dict[str, Any]] = queue.Queue()
    with running_fleet(child_env, tmp_path / "logs") as fleet, client.websocket_connect("/ws/events?queue=apiq") as ws:

        def read() -> None:
            try:
                while True:
                    received.put(ws.receive_json())
            except Exception:
                return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        job = client.post("/api/v1/jobs", json={"task": "api_echo", "args": {"text": "ws"}}).json()["id"]
        types: list[str] = []
        seen: list[dict[str, Any]] = []
        while "succeeded" not in types:
            try:
                evt = received.get(timeout=30)
            except queue.Empty:
                raise AssertionError(f"events so far: {seen}\n{fleet.logs()}") from None
            seen.append(evt)
            if evt["job_id"] == job:
                types.append(evt["type"])
        assert types == ["enqueued", "published", "started", "succeeded"]
        last = seen[-1]
        assert set(last) == {"event_id", "ts", "type", "job_id", "queue", "task", "attempt", "worker_id"}
        assert (last["queue"], last["task"], last["attempt"]) == ("apiq", "api_echo", 1)
        assert last["worker_id"].startswith("worker-")
