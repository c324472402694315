"""`stagedoor demo` with no URLs: embedded servers, orders flow end to end, SIGTERM leaves nothing behind.

When this machine allows it (root + util-linux `unshare`), the demo runs in a
fresh network namespace where only its own loopback exists, so it provably
cannot reach a PostgreSQL or Redis on 127.0.0.1:5432/6379.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

ORDERS = 25


def isolated_command(argv: list[str]) -> list[str]:
    can_unshare = os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip")
    if can_unshare and subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0:
        quoted = " ".join(f"'{a}'" for a in argv)
        return ["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {quoted}"]
    return argv


class Output:
    """Collects a process's output lines in a thread; waits for a pattern with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if found := regex.search(line):
                        return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line matching {pattern!r} in {timeout}s:\n" + "\n".join(self.lines[-40:]))
                self._cond.wait(left)


def processes_using(path: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if str(path) in cmdline:
            found.append(proc)
    return found


def test_demo_runs_end_to_end_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    state_dir = Path("/tmp") / f"pbx-demo-test-{os.getpid()}-{int(time.time())}"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env["PYTHONUNBUFFERED"] = "1"
    argv = [sys.executable, "-m", "postbox_examples", "demo", "--orders", str(ORDERS), "--rate", "25"]
    argv += ["--state-dir", str(state_dir)]
    process = subprocess.Popen(
        isolated_command(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output = Output(process)
    try:
        output.wait_for(r"^starting embedded PostgreSQL and Valkey", timeout=30)
        done = output.wait_for(r"^all (\d+) orders processed: every job finished", timeout=180)
        assert int(done.group(1)) == ORDERS
        summary = [line for line in output.lines if line.startswith("orders placed")][-1]
        assert f"orders placed {ORDERS}/{ORDERS} (rejected 0)" in summary
        assert f"emails delivered {ORDERS} " in summary  # counted at the mail provider
        table = {
            line.split()[0]: line.split()[1:] for line in output.lines if line.startswith(("  mail", "  stagedoor"))
        }
        # pending queued running retrying succeeded dead
        assert table["mail"] == ["0", "0", "0", "0", str(ORDERS), "0"]
        assert table["stagedoor"] == ["0", "0", "0", "0", str(2 * ORDERS), "0"]
        children = [int(m.group(1)) for line in output.lines if (m := re.search(r"started \S+\s+pid (\d+)", line))]
        assert len(children) == 6  # provider, 2 relays, 2 workers, api
        servers = processes_using(state_dir)
        assert servers, "the embedded servers run from the state folder"

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        output.wait_for(r"^stopping embedded servers", timeout=5)

        def left_behind() -> list[int]:
            left = [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
            return left + [p.pid for p in processes_using(state_dir) if p.is_running() and p.status() != "zombie"]

        wait_until(
            lambda: not left_behind(), 30, interval=0.2, message=lambda: f"no process left behind: {left_behind()}"
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        for proc in processes_using(state_dir):
            proc.kill()
        output.join(timeout=10)  # the reader ends at EOF; then the pipe is closed (warnings are errors)
        if process.stdout is not None:
            process.stdout.close()
        shutil.rmtree(state_dir, ignore_errors=True)
