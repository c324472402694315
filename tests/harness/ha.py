"""Helpers of the high-availability system tests: a steady producer, postbox processes, the invariants."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg

from tests.harness.tasks import ha as tasks_ha

JOBS_PER_SECOND = 50.0


class Producer(threading.Thread):
    """Enqueues one ``ha_effect`` job per transaction at a steady rate; remembers the ids whose COMMIT returned."""

    def __init__(self, url: str, rate: float = JOBS_PER_SECOND) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rate = rate
        self.committed: list[int] = []
        self.refused = 0
        self.halt = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        n = 0
        while not self.halt.wait(1 / self.rate):  # pacing the load, not waiting for a condition
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, connect_timeout=2)
                row = conn.execute(
                    "SELECT postbox.enqueue('ha_effect', jsonb_build_object('n', %s::int), %s)", (n, tasks_ha.QUEUE)
                ).fetchone()
                conn.commit()
                assert row is not None
                self.committed.append(int(row[0]))
                n += 1
            except psycopg.OperationalError:
                self.refused += 1  # the server is down or restarting: an application would retry too
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)


class Processes:
    """Relay and worker processes (``tests.harness.tasks.ha``); all killed on :meth:`close`."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, *argv: str) -> subprocess.Popen[bytes]:
        self.logs.append(self.log_dir / f"{argv[1].rsplit('.', 1)[-1]}-{len(self.procs)}.log")
        with open(self.logs[-1], "wb") as out:
            proc = subprocess.Popen([sys.executable, *argv], env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def relay(self) -> subprocess.Popen[bytes]:
        return self.start("-m", "postbox.relay", "run")

    def worker(self, concurrency: int = 4) -> subprocess.Popen[bytes]:
        return self.start(
            "-m", "postbox.worker", "run", "--tasks", "tests.harness.tasks.ha", "--queues", tasks_ha.QUEUE,
            "--concurrency", str(concurrency),
        )  # fmt: skip

    def exit_codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def text(self, kind: str) -> str:
        return "\n".join(log.read_text(errors="replace") for log in self.logs if log.name.startswith(kind))

    def tail(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) for log in self.logs
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


def one(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def finished_count(url: str) -> int:
    return int(one(url, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'"))


def all_finished(url: str) -> bool:
    return bool(one(url, "SELECT count(*) = count(*) FILTER (WHERE state = 'succeeded') FROM postbox.outbox"))


def check_invariants(url: str, committed: list[int]) -> None:
    """Every committed job succeeded, with exactly one effect; attempts within max_attempts."""
    with psycopg.connect(url, autocommit=True) as conn:
        states = conn.execute("SELECT state, count(*) FROM postbox.outbox GROUP BY 1").fetchall()
        assert [s for s, _ in states] == ["succeeded"], states
        ids = {r[0] for r in conn.execute("SELECT id FROM postbox.outbox")}
        assert set(committed) <= ids  # every acknowledged commit is a job (an unacknowledged one may be too)
        doubled = conn.execute("SELECT job_id, count(*) FROM public.ha_effects GROUP BY 1 HAVING count(*) <> 1")
        assert doubled.fetchall() == []
        assert {r[0] for r in conn.execute("SELECT job_id FROM public.ha_effects")} == ids
        # Runs interrupted among others (lost, Interrupted) are counted in attempts, not charged.
        over = conn.execute(
            "SELECT count(*) FROM postbox.outbox o WHERE o.attempts - (SELECT count(*) FROM postbox.job_attempts a"
            " WHERE a.outbox_id = o.id AND a.outcome = 'lost' AND a.error_class = 'Interrupted') > o.max_attempts"
        ).fetchone()
        assert over == (0,)
