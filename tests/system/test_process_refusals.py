"""Every process says what to do: an unmigrated database, a server that does not answer, a missing
database — one line on stderr naming the fix or the URL (password hidden), exit 2, no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.harness.databases import with_database

pytestmark = pytest.mark.system

PROCESSES = {
    "relay": ["relay", "run"],
    "worker": ["worker", "run", "--tasks", "tests.harness.tasks.worker"],
    "api": ["api", "run", "--port", "1"],  # refused before it binds: never served
}


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postbox(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "postbox.app", *argv], env=env, capture_output=True, text=True, timeout=90
    )
    return done, time.monotonic() - started


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("name", ["relay", "api"])
def test_relay_and_api_refuse_an_unmigrated_database_naming_postbox_migrate(
    name: str, child_env: dict[str, str], empty_database_url: str
) -> None:
    done, _ = postbox(PROCESSES[name], {**child_env, "POSTBOX_DATABASE_URL": empty_database_url})
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert line.startswith(f"postbox {name}: the database has no postbox schema")
    assert line.endswith("run `postbox migrate`")


@pytest.mark.parametrize("name", ["relay", "worker", "api"])
def test_a_redis_that_does_not_answer_is_one_line_naming_the_url_and_the_wait(
    name: str, child_env: dict[str, str]
) -> None:
    url = f"redis://:s3cret@127.0.0.1:{closed_port()}/0"
    env = {**child_env, "POSTBOX_REDIS_URL": url, "POSTBOX_START_TIMEOUT": "1.5"}
    done, took = postbox(PROCESSES[name], env)
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert line.startswith(f"postbox {name}: cannot reach Redis at redis://:***@127.0.0.1:")
    assert "s3cret" not in line
    assert "attempts in 1." in line and "POSTBOX_START_TIMEOUT" in line
    assert took < 30


@pytest.mark.parametrize("name", ["relay", "worker", "api", "migrate", "queues"])
def test_postgresql_that_does_not_answer_is_one_line_after_the_bounded_wait(
    name: str, child_env: dict[str, str]
) -> None:
    url = f"postgresql://postgres:s3cret@127.0.0.1:{closed_port()}/postgres"
    env = {**child_env, "POSTBOX_DATABASE_URL": url, "POSTBOX_START_TIMEOUT": "1"}
    argv = {**PROCESSES, "migrate": ["migrate"], "queues": ["queues", "list"]}[name]
    done, took = postbox(argv, env)
    assert done.returncode == (1 if name == "queues" else 2), done.stderr
    line = one_line(done.stderr)
    prefix = "postbox queues: error: " if name == "queues" else f"postbox {name}: "
    assert line.startswith(f"{prefix}cannot reach PostgreSQL at postgresql://postgres:***@127.0.0.1:")
    assert "Connection refused" in line and "s3cret" not in line
    assert "attempts in 1." in line
    assert took < 30


@pytest.mark.parametrize("name", ["relay", "worker", "api", "migrate", "queues"])
def test_a_missing_database_is_refused_at_once_in_one_line(name: str, child_env: dict[str, str]) -> None:
    url = with_database(child_env["POSTBOX_DATABASE_URL"], "postbox_no_such_db")
    env = {**child_env, "POSTBOX_DATABASE_URL": url, "POSTBOX_START_TIMEOUT": "60"}
    argv = {**PROCESSES, "migrate": ["migrate"], "queues": ["queues", "list"]}[name]
    done, took = postbox(argv, env)
    assert done.returncode == (1 if name == "queues" else 2), done.stderr
    line = one_line(done.stderr)
    assert 'refused the connection: database "postbox_no_such_db" does not exist' in line
    assert took < 30  # not the 60 s of POSTBOX_START_TIMEOUT: a refusal is final


def test_relay_run_accepts_tasks_like_the_worker(child_env: dict[str, str]) -> None:
    done, _ = postbox(["relay", "run", "--tasks", "tests.no_such_tasks"], child_env)
    assert done.returncode == 2, done.stderr
    assert "postbox relay: POSTBOX_TASKS: cannot import tests.no_such_tasks" in done.stderr
    assert "unrecognized arguments" not in done.stderr


def test_jobs_enqueue_of_an_unknown_task_names_tasks(child_env: dict[str, str]) -> None:
    done, _ = postbox(["jobs", "enqueue", "api_sum"], child_env)
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert line == (
        "postbox jobs: error: unknown task 'api_sum': name the module that defines it with --tasks or"
        " POSTBOX_TASKS (loaded: none)"
    )
    argv = ["jobs", "enqueue", "api_sum", "--args", '{"a": 1, "b": 2}', "--tasks", "tests.harness.tasks.api"]
    done, _ = postbox(argv, child_env)
    assert done.returncode == 0, done.stderr
    assert "enqueued on queue apiq" in done.stdout
