"""Request bodies over real HTTP against ``stagedoor api run``: chunked, oversized, short."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.fleet import child
from tests.harness.redis_server import free_port
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

LIMIT = 1000 + 65_536  # POSTBOX_MAX_PAYLOAD_BYTES=1000 plus the envelope
BODY_TIMEOUT = 1.0
CHUNK = 65_536


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def api(child_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The demo's API process (postbox's routes and Stagedoor's)."""
    port = free_port()
    env = {
        **child_env,
        "POSTBOX_TASKS": "tests.harness.tasks.api",
        "POSTBOX_MAX_PAYLOAD_BYTES": "1000",
        "POSTBOX_API_BODY_TIMEOUT": str(BODY_TIMEOUT),
    }
    log_path = tmp_path / "api.log"
    argv = ["-m", "postbox_examples", "api", "run", "--port", str(port)]
    with child(argv, env, log_path):
        try:
            wait_until(lambda: _healthy(f"http://127.0.0.1:{port}"), 120)  # a busy machine starts it slowly
        except AssertionError:
            raise AssertionError(log_path.read_text()) from None
        yield "127.0.0.1", port


def _head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json", *headers, "", ""]
    return "\r\n".join(lines).encode()


def _response(sock: socket.socket, timeout: float = 30.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65_536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def _chunked_upload(api: tuple[str, int], path: str) -> tuple[bytes, int]:
    """Send up to 100 MB chunked (no Content-Length) until the server answers; (answer, bytes sent)."""
    sent = 0
    frame = f"{CHUNK:x}\r\n".encode() + b" " * CHUNK + b"\r\n"
    with socket.create_connection(api, timeout=30) as sock:
        sock.sendall(_head(path, "Transfer-Encoding: chunked"))
        try:
            while sent < 100_000_000:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered
                sock.sendall(frame)
                sent += CHUNK
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _response(sock), sent


def _counted(api: tuple[str, int], status: int) -> float:
    metrics = httpx.get(f"http://{api[0]}:{api[1]}/metrics", timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("postbox_api_requests_total{") and f'status="{status}"' in line
    )


def test_chunked_and_declared_oversized_uploads_are_cut_at_the_limit_on_every_route(api: tuple[str, int]) -> None:
    paths = ["/api/v1/jobs", "/api/v1/orders", "/api/v1/events"]
    for path in paths:
        answer, sent = _chunked_upload(api, path)
        assert answer.startswith(b"HTTP/1.1 413 "), (path, answer[:200])
        assert b'"code":"PAYLOAD_TOO_LARGE"' in answer
        assert sent < 20 * LIMIT + 8_000_000, path  # cut after the limit (plus socket buffers), not at 100 MB
    with socket.create_connection(api, timeout=30) as sock:
        sock.sendall(_head("/api/v1/events", f"Content-Length: {LIMIT + 1}"))
        assert _response(sock).startswith(b"HTTP/1.1 413 ")
    assert _counted(api, 413) == len(paths) + 1


def test_short_and_slow_bodies_time_out_with_408(api: tuple[str, int]) -> None:
    with socket.create_connection(api, timeout=30) as sock:
        sock.sendall(_head("/api/v1/orders", "Content-Length: 100") + b'{"event_id":')
        started = time.monotonic()
        answer = _response(sock)  # returns when the server closes the connection
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b'"code":"REQUEST_TIMEOUT"' in answer
    assert BODY_TIMEOUT * 0.9 <= took < BODY_TIMEOUT + 10

    body = b'{"task": "api_echo", "args": {}}'
    with socket.create_connection(api, timeout=30) as sock:
        sock.sendall(_head("/api/v1/jobs", f"Content-Length: {len(body)}"))
        started = time.monotonic()
        for byte in body:  # one byte every 0.2 s: the whole body would take over 6 s
            if select.select([sock], [], [], 0.2)[0]:
                break
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = _response(sock)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert took < BODY_TIMEOUT + 10
    assert _counted(api, 408) == 2
