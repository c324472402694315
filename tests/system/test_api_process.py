"""``postbox api run`` as a real process: serves HTTP and the WebSocket, stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.harness.redis_server import free_port
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_api_run_serves_rest_and_websocket_and_stops_on_sigterm(child_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api"}
    log = open(tmp_path / "api.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "postbox.app", "api", "run", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until(lambda: _healthy(url), 30)
        except AssertionError:
            raise AssertionError((tmp_path / "api.log").read_text()) from None
        assert httpx.get(url + "/ready", timeout=5).json()["status"] == "ready"
        with connect(f"ws://127.0.0.1:{port}/ws/events?queue=apiq", open_timeout=10) as ws:
            created = httpx.post(url + "/api/v1/jobs", json={"task": "api_echo"}, timeout=5)
            assert created.status_code == 201
            evt = json.loads(ws.recv(timeout=10))
            assert (evt["type"], evt["job_id"], evt["queue"]) == ("enqueued", created.json()["id"], "apiq")
        # postbox's operations surface only: no example routes, no example queue.
        queues = httpx.get(url + "/api/v1/queues", timeout=5).json()
        assert [q["queue"] for q in queues] == ["apiq"]
        order = {"event_id": 1, "seats": 1, "email": "a@example.org"}
        assert httpx.post(url + "/api/v1/orders", json=order, timeout=5).status_code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_api_run_refuses_a_bad_port_naming_the_setting(child_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "postbox.app", "api", "run", "--port", "70000"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "POSTBOX_API_PORT" in proc.stderr
