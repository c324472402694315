"""The admin CLI on the real database and Redis: output, exit codes, and bad input that writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from postbox.app.admin import dlq_cli, jobs_cli, queues_cli, workers_cli
from postbox.settings import Settings
from tests.harness.api import audit_rows, insert_job, job_state, make_dead


@pytest.fixture(autouse=True)
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)
    monkeypatch.setenv("POSTBOX_TASKS", "tests.harness.tasks.api")


def _count(conn: psycopg.Connection[Any], query: str = "SELECT count(*) FROM postbox.outbox") -> int:
    row = conn.execute(query).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


def test_jobs_enqueue_get_list_cancel(conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert jobs_cli.main(["enqueue", "api_sum", "--args", '{"a": 1, "b": 2}', "--priority", "7", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    job = created["id"]
    assert created == {"id": job, "duplicate": False, "queue": "apiq", "task": "api_sum"}
    assert jobs_cli.main(["enqueue", "api_echo", "--dedup-key", "k1"]) == 0
    assert "enqueued on queue apiq" in capsys.readouterr().out
    assert jobs_cli.main(["enqueue", "api_echo", "--dedup-key", "k1"]) == 0
    assert "already exists" in capsys.readouterr().out

    assert jobs_cli.main(["get", str(job), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["state"], got["priority"], got["args"]) == ("pending", 7, {"a": 1, "b": 2})
    assert jobs_cli.main(["get", str(job)]) == 0
    out = capsys.readouterr().out
    assert "api_sum" in out and "history:" in out

    assert jobs_cli.main(["list", "--queue", "apiq", "--limit", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ID", "TASK", "QUEUE"]
    assert out[1].split()[1] == "api_echo"
    assert out[-1].startswith("more: --cursor ")

    assert jobs_cli.main(["cancel", str(job)]) == 0
    assert capsys.readouterr().out.strip() == f"job {job} cancelled"
    assert job_state(conn, job) == "cancelled"
    user_rows = audit_rows(conn)
    assert (
        len(user_rows) == 1 and user_rows[0][0].startswith("cli:") and user_rows[0][1:3] == ("job.cancel", f"job:{job}")
    )

    assert jobs_cli.main(["cancel", str(job)]) == 1
    assert capsys.readouterr().err.strip() == f"postbox jobs: error: job {job} is already cancelled"
    assert jobs_cli.main(["get", "987654"]) == 1
    assert capsys.readouterr().err.strip() == "postbox jobs: error: job 987654 not found"


JOBS_BAD_INPUT = (
    (["enqueue", "api_sum", "--args", "{not json"], "--args is not valid JSON"),
    (["enqueue", "api_sum", "--args", "[1]"], "--args must be a JSON object"),
    (["enqueue", "nope"], "unknown task 'nope'"),
    (["enqueue", "api_sum", "--args", '{"a": "x"}'], "invalid args for task 'api_sum'"),
    (["enqueue", "api_sum", "--args", '{"a": 1}', "--priority", "10"], "priority must be an integer 0-9"),
    (["enqueue", "api_sum", "--args", '{"a": 1}', "--queue", "Bad Queue"], "invalid queue name"),
    (
        ["enqueue", "api_sum", "--args", '{"a": 1}', "--tasks", "no.such.module"],
        "cannot import no.such.module: ModuleNotFoundError",
    ),
    (["get", "abc"], "invalid job id 'abc'"),
    (["cancel", "0"], "invalid job id '0'"),
    (["list", "--state", "bogus"], "unknown state 'bogus'"),
    (["list", "--cursor", "zzz"], "cursor is not one this API returned"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command"),
)


def test_jobs_bad_input_is_exit_2_with_a_message_and_writes_nothing(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, message in JOBS_BAD_INPUT:
        assert jobs_cli.main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("postbox jobs: error: ")
        assert message in captured.err, (argv, captured.err)
    assert _count(conn) == 0
    assert audit_rows(conn) == []


def test_dlq_commands(conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    dead = insert_job(conn)
    make_dead(conn, dead, attempts=2, error="kaput")
    gone = insert_job(conn)
    make_dead(conn, gone)

    assert dlq_cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [str(gone), str(dead)]
    assert dlq_cli.main(["show", str(dead), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["last_error"], len(shown["history"]), shown["discarded"]) == ("kaput", 2, False)

    assert dlq_cli.main(["requeue", str(dead)]) == 0
    assert capsys.readouterr().out.strip() == f"job {dead} requeued (state pending, attempts reset)"
    assert job_state(conn, dead) == "pending"
    assert dlq_cli.main(["requeue", str(dead)]) == 1
    assert "is not a dead letter (state pending)" in capsys.readouterr().err

    assert dlq_cli.main(["discard", str(gone)]) == 0
    assert dlq_cli.main(["list", "--discarded", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert [(j["id"], j["discarded"]) for j in listed["items"]] == [(gone, True)]
    actions = [row[1] for row in audit_rows(conn)]
    assert actions == ["dlq.requeue", "dlq.discard"]


def test_dlq_purge_asks_unless_yes(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = insert_job(conn)
    make_dead(conn, job)
    dead = "SELECT count(*) FROM postbox.outbox WHERE state = 'dead'"

    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert dlq_cli.main(["purge", "--queue", "apiq", "--older-than", "0"]) == 1
    assert "purge would delete 1 dead letters of 'apiq'" in capsys.readouterr().err
    assert _count(conn, dead) == 1

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert dlq_cli.main(["purge", "--queue", "apiq", "--older-than", "0"]) == 1
    assert "aborted; nothing deleted" in capsys.readouterr().err
    assert _count(conn, dead) == 1
    assert audit_rows(conn) == []

    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert dlq_cli.main(["purge", "--queue", "apiq", "--older-than", "0"]) == 0
    assert capsys.readouterr().out.strip() == "purged 1 dead letters of queue apiq"
    assert _count(conn, dead) == 0

    other = insert_job(conn)
    make_dead(conn, other)
    assert dlq_cli.main(["purge", "--queue", "apiq", "--older-than", "1d", "--yes"]) == 0
    assert capsys.readouterr().out.strip() == "purged 0 dead letters of queue apiq"
    assert dlq_cli.main(["purge", "--queue", "apiq", "--older-than", "0s", "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"queue": "apiq", "purged": 1}
    assert [row[1] for row in audit_rows(conn)] == ["dlq.purge", "dlq.purge", "dlq.purge"]


DLQ_BAD_INPUT = (
    (["purge", "--queue", "apiq"], "the following arguments are required: --older-than"),
    (["purge", "--queue", "apiq", "--older-than", "soon", "--yes"], "invalid duration 'soon'"),
    (["purge", "--queue", "Bad!", "--older-than", "0", "--yes"], "invalid queue name"),
    (["show", "x"], "invalid job id 'x'"),
    (["list", "--limit", "0"], "limit must be an integer 1-500"),
)


def test_dlq_bad_input(conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    job = insert_job(conn)
    make_dead(conn, job)
    for argv, message in DLQ_BAD_INPUT:
        assert dlq_cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("postbox dlq: error: ") and message in err, (argv, err)
    assert _count(conn, "SELECT count(*) FROM postbox.outbox WHERE state = 'dead'") == 1
    assert audit_rows(conn) == []


def test_queues_and_workers(conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    insert_job(conn)
    assert queues_cli.main(["pause", "apiq"]) == 0
    assert capsys.readouterr().out.strip() == "queue apiq paused"
    assert queues_cli.main(["list", "--json"]) == 0
    stats = {q["queue"]: q for q in json.loads(capsys.readouterr().out)}
    assert (stats["apiq"]["paused"], stats["apiq"]["backlog"], stats["apiq"]["in_streams"]) == (True, 1, 0)
    assert queues_cli.main(["resume", "apiq"]) == 0
    assert queues_cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["QUEUE", "PAUSED", "BACKLOG"]
    assert out[2].split()[:3] == ["apiq", "False", "1"]
    assert queues_cli.main(["pause", "NO!"]) == 2
    assert "invalid queue name" in capsys.readouterr().err

    conn.execute(
        "INSERT INTO postbox.workers (id, host, pid, last_seen)"
        " VALUES ('worker-11111111', 'h', 1, now() - interval '1 hour')"
    )
    conn.commit()
    assert workers_cli.main(["list", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [(w["id"], w["stale"]) for w in found] == [("worker-11111111", True)]
    assert workers_cli.main(["list"]) == 0
    assert "worker-11111111" in capsys.readouterr().out


def test_unreachable_database_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.setenv("POSTBOX_START_TIMEOUT", "0")  # one attempt, no wait
    assert workers_cli.main(["list"]) == 1
    assert capsys.readouterr().err.startswith(
        "postbox workers: error: cannot reach PostgreSQL at postgresql://postgres@127.0.0.1:1/none: Connection refused"
    )
    monkeypatch.setenv("POSTBOX_DATABASE_URL", "mysql://nope")
    assert workers_cli.main(["list"]) == 2
    assert "POSTBOX_DATABASE_URL" in capsys.readouterr().err


def test_the_postbox_command_runs_a_subcommand(child_env: dict[str, str], conn: psycopg.Connection[Any]) -> None:
    job = insert_job(conn)
    make_dead(conn, job)
    proc = subprocess.run(
        [sys.executable, "-m", "postbox.app", "dlq", "purge", "--queue", "apiq", "--older-than", "0"],
        env=child_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "no terminal to confirm on: pass --yes" in proc.stderr
    assert _count(conn, "SELECT count(*) FROM postbox.outbox WHERE state = 'dead'") == 1


def test_jobs_get_shows_each_failed_attempts_traceback(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    job = insert_job(conn, "api_sum", "apiq")
    conn.execute(
        "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, finished_at, outcome, error_class, error,"
        " traceback) VALUES (%s, 1, 'worker-1', now(), 'retry', 'KeyError', '''k''',"
        " 'Traceback (most recent call last):\n  File \"shop/tasks.py\", line 9, in charge\nKeyError: ''k''\n')",
        (job,),
    )
    conn.commit()
    assert jobs_cli.main(["get", str(job)]) == 0
    out = capsys.readouterr().out
    assert "attempt 1 (life 1) traceback:\nTraceback (most recent call last):" in out
    assert 'File "shop/tasks.py", line 9, in charge' in out


def test_jobs_get_opens_an_encrypted_tasks_args_with_the_key_and_shows_the_envelope_without(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    import postbox
    from postbox import encryption
    from tests.harness.tasks import job_control as jc

    key = "k1:" + base64.b64encode(b"\x05" * 32).decode()
    other = "k1:" + base64.b64encode(b"\x06" * 32).decode()  # the same key id, another key
    card = "4000-0000-0000-0002"
    encryption.use_keys(key)
    try:
        job = int(postbox.enqueue(conn, jc.jc_secret, {"card": card, "n": 7}))
        conn.commit()
    finally:
        encryption.use_keys(None)
    try:
        monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", key)
        assert jobs_cli.main(["get", str(job), "--json"]) == 0
        got = capsys.readouterr()
        assert json.loads(got.out)["args"] == {"card": card, "n": 7} and got.err == ""
        assert jobs_cli.main(["get", str(job)]) == 0
        assert card in capsys.readouterr().out

        monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", other)  # does not open: the envelope, and why
        assert jobs_cli.main(["get", str(job), "--json"]) == 0
        got = capsys.readouterr()
        assert set(json.loads(got.out)["args"]) == {encryption.ENVELOPE} and card not in got.out
        assert f"job {job}: its args stay sealed" in got.err and card not in got.err

        monkeypatch.delenv("POSTBOX_ENCRYPTION_KEYS")  # no key: the envelope, quietly
        assert jobs_cli.main(["get", str(job), "--json"]) == 0
        got = capsys.readouterr()
        assert set(json.loads(got.out)["args"]) == {encryption.ENVELOPE} and got.err == ""
        stored = conn.execute("SELECT args::text FROM postbox.outbox WHERE id = %s", (job,)).fetchone()
        conn.commit()
        assert stored is not None and card not in stored[0]  # nothing written back
    finally:
        encryption.use_keys(None)
