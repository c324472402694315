"""``postbox worker run`` / ``python -m worker run`` as processes: bad input, metrics, SIGINT."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import postbox
from postbox import migrate, revision
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60)


def test_missing_database_url_fails_fast_naming_it(child_env: dict[str, str]) -> None:
    env = {k: v for k, v in child_env.items() if k != "POSTBOX_DATABASE_URL"}
    done = run(["-m", "postbox.worker", "run", "--tasks", "tests.harness.tasks.worker"], env)
    assert done.returncode == 2
    assert "POSTBOX_DATABASE_URL" in done.stderr


def test_bad_flags_fail_fast_naming_the_setting(child_env: dict[str, str]) -> None:
    done = run(
        ["-m", "postbox.app", "worker", "run", "--tasks", "tests.harness.tasks.worker", "--concurrency", "0"], child_env
    )
    assert done.returncode == 2 and "POSTBOX_CONCURRENCY" in done.stderr
    done = run(["-m", "postbox.worker", "run", "--tasks", "tests.no_such_tasks"], child_env)
    assert done.returncode == 2 and "POSTBOX_TASKS" in done.stderr
    done = run(["-m", "postbox.worker", "run", "--queues", "Bad Name"], child_env)
    assert done.returncode == 2 and "POSTBOX_QUEUES" in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_database_older_than_the_code_is_refused_before_anything_is_written(
    child_env: dict[str, str], empty_database_url: str, tmp_path: Path
) -> None:
    # A task with a schedule: what a worker writes at its start (schedules, task definitions,
    # its own row) would be written by one that did not check the schema first.
    (tmp_path / "rev_tasks.py").write_text(
        "import postbox\n\n@postbox.task(queue='rev')\ndef tick(ctx: object) -> None: ...\n\n"
        "postbox.periodic(tick, every=300)\n"
    )
    env = {**child_env, "POSTBOX_DATABASE_URL": empty_database_url}

    def start() -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "postbox.worker", "run", "--tasks", "rev_tasks"]
        return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    done = start()
    assert done.returncode == 2, done.stderr
    assert f"postbox worker: the database has no postbox schema (revision {revision.REQUIRED} needed)" in done.stderr
    assert "Traceback" not in done.stderr

    migrate.upgrade(empty_database_url, "0005_fenced_success")
    done = start()
    assert done.returncode == 2, done.stderr
    assert (
        "the database's postbox schema is at revision 0005_fenced_success;"
        f" this postbox needs {revision.REQUIRED}: run `postbox migrate`"
    ) in done.stderr
    with psycopg.connect(empty_database_url) as conn:
        written = conn.execute(
            "SELECT (SELECT count(*) FROM postbox.workers), (SELECT count(*) FROM postbox.schedules),"
            " (SELECT count(*) FROM postbox.tasks)"
        ).fetchone()
    assert written == (0, 0, 0)


def test_worker_process_serves_metrics_and_stops_on_sigint(child_env: dict[str, str], database_url: str) -> None:
    port = _free_port()
    env = {**child_env, "POSTBOX_WORKER_METRICS_PORT": str(port), "POSTBOX_TASKS": "tests.harness.tasks.worker"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "postbox.app", "worker", "run", "--queues", t.QUEUE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row: Any = wait_until(
                lambda: conn.execute("SELECT id FROM postbox.workers WHERE pid = %s", (proc.pid,)).fetchone(),
                30,
                message="the worker registered",
            )
            assert row[0].startswith("worker-") and len(row[0]) == 15
            postbox.enqueue(conn, t.w_noop)

            relay = subprocess.Popen([sys.executable, "-m", "postbox.relay", "run"], env=env, stderr=subprocess.DEVNULL)
            try:
                wait_until(
                    lambda: conn.execute("SELECT state FROM postbox.outbox").fetchone() == ("succeeded",),
                    30,
                    message="the job succeeded",
                )
            finally:
                relay.kill()
                relay.wait(10)
            body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            assert f'postbox_worker_jobs_total{{outcome="succeeded",queue="{t.QUEUE}",task="w_noop"}} 1.0' in body
            assert "postbox_worker_in_flight 0.0" in body
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)  # reaps the process and closes its stderr pipe


def test_task_modules_import_from_the_current_directory(child_env: dict[str, str], tmp_path: Path) -> None:
    """Like Celery's -A: `postbox worker run --tasks shop.tasks` from the application's folder, no install."""
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(
        "from pathlib import Path\n"
        "from postbox import task\n\n"
        "@task(queue='shopq')\n"
        "def ship(ctx, order_id: int) -> None: ...\n\n"
        "Path('imported').write_text(__name__)\n"
    )
    postbox = str(Path(sys.executable).parent / "postbox")
    worker = subprocess.Popen(
        [postbox, "worker", "run", "--tasks", "shop.tasks"],
        cwd=tmp_path,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def imported() -> str:
            assert worker.poll() is None, worker.communicate()[0]
            # The file exists a moment before its text is written: wait for the text, not the file.
            marker = tmp_path / "imported"
            return marker.read_text() if marker.exists() else ""

        assert wait_until(imported, 60, message="the task module imported") == "shop.tasks"
    finally:
        worker.terminate()
        output = worker.communicate(timeout=60)[0]  # reaps the process and closes its stdout pipe
    assert worker.returncode == 0, output


def test_a_task_module_that_fails_to_import_shows_its_traceback(child_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "broken_tasks.py").write_text("import os\n\nSETTING = os.environ['NO_SUCH_SETTING_FOR_TASKS']\n")
    postbox = str(Path(sys.executable).parent / "postbox")
    done = subprocess.run(
        [postbox, "worker", "run", "--tasks", "broken_tasks"],
        cwd=tmp_path,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr
    assert str(tmp_path / "broken_tasks.py") in done.stderr and "line 3" in done.stderr
    assert "POSTBOX_TASKS: cannot import broken_tasks: KeyError: 'NO_SUCH_SETTING_FOR_TASKS'" in done.stderr
