"""``postbox limits`` on the real database: output, audit rows, exit codes, and bad input that writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from postbox.app.admin import limits_cli
from postbox.settings import Settings
from tests.harness.api import audit_rows

DECLARED = '{"concurrency": 3, "rate": null, "partition_by": null}'


@pytest.fixture(autouse=True)
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)
    monkeypatch.setenv("POSTBOX_TASKS", "tests.harness.tasks.api")


def _overrides(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    rows = conn.execute("SELECT scope, name, override, override_by FROM postbox.limits ORDER BY scope, name").fetchall()
    conn.commit()
    return rows


def test_list_show_set_clear(conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    conn.execute("INSERT INTO postbox.limits (scope, name, declared) VALUES ('task', 'f_conc', %s::jsonb)", (DECLARED,))
    conn.commit()

    assert limits_cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SCOPE", "NAME", "QUEUE", "DECLARED", "OVERRIDE", "EFFECTIVE", "IN_USE", "HELD"]
    assert out[1].split()[:2] == ["task", "f_conc"] and "concurrency 3" in out[1]

    assert limits_cli.main(["set", "task", "f_conc", "--concurrency", "1", "--rate", "10/s"]) == 0
    assert capsys.readouterr().out.strip() == (
        "task f_conc: override concurrency 1, rate 10/s; in force: concurrency 1, rate 10/s"
    )
    actor = _overrides(conn)[0][3]
    assert actor.startswith("cli:")
    assert _overrides(conn) == [
        ("task", "f_conc", {"concurrency": 1, "rate": {"limit": 10, "period": 1.0, "burst": 1}}, actor)
    ]

    # Merged: a later --rate none keeps the concurrency and lifts the rate (even a declared one).
    assert limits_cli.main(["set", "task", "f_conc", "--rate", "none", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["override"] == {"concurrency": 1, "rate": None} and shown["effective"]["rate"] is None

    assert limits_cli.main(["show", "task", "f_conc"]) == 0
    out = capsys.readouterr().out
    assert "concurrency 1, rate none" in out and "in_use" in out

    assert limits_cli.main(["clear", "task", "f_conc", "--field", "concurrency"]) == 0
    assert capsys.readouterr().out.strip() == "task f_conc: override of concurrency cleared; in force: concurrency 3"
    assert limits_cli.main(["clear", "task", "f_conc", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["override"] is None

    # A queue with no row yet: the override creates it; a JSON rate with a burst.
    assert limits_cli.main(["set", "queue", "mail", "--rate", '{"limit": 5, "period": 60, "burst": 2}']) == 0
    assert capsys.readouterr().out.strip() == "queue mail: override rate 5/m (burst 2); in force: rate 5/m (burst 2)"

    assert [row[1:3] for row in audit_rows(conn)] == [
        ("limit.override", "limit:task:f_conc"),
        ("limit.override", "limit:task:f_conc"),
        ("limit.clear", "limit:task:f_conc"),
        ("limit.clear", "limit:task:f_conc"),
        ("limit.override", "limit:queue:mail"),
    ]
    assert all(row[0].startswith("cli:") for row in audit_rows(conn))


BAD_INPUT = (
    (["set", "task", "f_conc", "--concurrency", "0"], "concurrency must be an integer 1-1000000"),
    (["set", "task", "f_conc", "--concurrency", "many"], "invalid concurrency 'many'"),
    (["set", "task", "f_conc", "--rate", "fast"], "invalid rate 'fast'"),
    (["set", "task", "f_conc", "--rate", "{bad"], "not valid JSON"),
    (["set", "task", "f_conc", "--rate", "5/.s"], "invalid rate '5/.s'"),
    (["set", "task", "f_conc", "--rate", "9" * 5000 + "/s"], "invalid rate '999"),
    (["set", "task", "f_conc", "--rate", '{"limit": 5, "period": "x"}'], "rate period must be a number"),
    (["set", "task", "f_conc", "--concurrency", "9" * 5000], "invalid concurrency '999"),
    (["set", "task", "f_conc"], "an override sets at least one of: concurrency, rate"),
    (["set", "bucket", "x", "--concurrency", "2"], "unknown scope 'bucket'"),
    (["set", "queue", "Bad Queue", "--concurrency", "2"], "invalid queue name 'Bad Queue'"),
    (["clear", "task", "f_conc", "--field", "burst"], "invalid choice: 'burst'"),
    (["show", "bucket", "x"], "unknown scope 'bucket'"),
)


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_bad_input_exits_2_and_writes_nothing(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    conn.execute("INSERT INTO postbox.limits (scope, name, declared) VALUES ('task', 'f_conc', %s::jsonb)", (DECLARED,))
    conn.commit()
    before = _overrides(conn)
    assert limits_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("postbox limits: error: ") and message in err, err
    assert _overrides(conn) == before and audit_rows(conn) == []


def test_unknown_limit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert limits_cli.main(["show", "task", "never_seen"]) == 1
    assert capsys.readouterr().err.strip() == "postbox limits: error: no limits for task 'never_seen'"
    assert limits_cli.main(["clear", "queue", "nowhere"]) == 1
    assert capsys.readouterr().err.strip() == "postbox limits: error: no limits for queue 'nowhere'"


def test_wired_in_the_postbox_command(settings: Settings, child_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "postbox.app", "limits", "set", "task", "f_rate", "--rate", "2/s"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "task f_rate: override rate 2/s; in force: rate 2/s"
    listed = subprocess.run(
        [sys.executable, "-m", "postbox.app", "limits", "list", "--json"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert [(item["scope"], item["name"]) for item in json.loads(listed.stdout)] == [("task", "f_rate")]
