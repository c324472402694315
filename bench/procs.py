"""Child processes of a bench run: relays, workers (and peers' workers), stopped for sure.

Each child gets the bench's environment (database, Redis, prefix) and its
stderr goes to a log file under the run's temp folder, shown when it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                self.process.wait(5)
        return self.process.returncode


@dataclass
class Children:
    """Every child started for one measurement; ``stop_all`` in a finally."""

    env: Mapping[str, str]
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="postbox-bench-")))
    started: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], extra_env: Mapping[str, str] | None = None) -> Child:
        log_path = self.folder / f"{name}-{len(self.started)}.log"
        env = dict(self.env)
        env.update(extra_env or {})
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                list(argv), env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        child = Child(name, process, log_path)
        self.started.append(child)
        return child

    def python(self, name: str, module_args: Sequence[str], extra_env: Mapping[str, str] | None = None) -> Child:
        return self.start(name, [sys.executable, "-m", *module_args], extra_env)

    def check_alive(self) -> None:
        for child in self.started:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}:\n{child.tail()}")

    def stop_all(self) -> None:
        """Stop every child; keep the folder of logs only if one of them failed (exit code other than 0 or -SIGTERM)."""
        failed = False
        for child in reversed(self.started):
            code = child.stop()
            failed = failed or code not in (0, -signal.SIGTERM, -signal.SIGKILL)
        self.started.clear()
        if not failed:
            shutil.rmtree(self.folder, ignore_errors=True)


def bench_env(database_url: str, redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    """The environment of a postbox child: the bench's database and Redis prefix, nothing inherited from POSTBOX_*."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        POSTBOX_DATABASE_URL=database_url,
        POSTBOX_REDIS_URL=redis_url,
        POSTBOX_REDIS_PREFIX=prefix,
        POSTBOX_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def children(env: Mapping[str, str]) -> Iterator[Children]:
    group = Children(env)
    try:
        yield group
    finally:
        group.stop_all()
