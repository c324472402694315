"""The example mail provider as a real process, for tests that count deliveries at the provider."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import httpx

from tests.harness.redis_server import free_port
from tests.harness.wait import wait_until


class ProviderProcess:
    """``stagedoor provider run`` on a free port; ``stop()`` always (a fixture does)."""

    def __init__(self, database_url: str, extra_args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "postbox_examples",
            "provider",
            "run",
            "--port",
            str(self.port),
            "--database-url",
            database_url,
            *extra_args,
        ]
        self.env = dict(env if env is not None else os.environ)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> ProviderProcess:
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until(self._healthy, timeout, message="the provider healthy", ignore=(httpx.HTTPError,))
        except AssertionError:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise RuntimeError(f"provider exited with {self.proc.returncode}: {err[-2000:]}")
        return httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200

    def messages(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/v1/messages", timeout=10)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
