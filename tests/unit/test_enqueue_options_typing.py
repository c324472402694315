"""The enqueue options are one typed definition (postbox.EnqueueOptions) that mypy checks at every call site.

mypy runs on a small file with the repository's configuration: a misspelt
option or a wrong type is an error at ``enqueue``, ``enqueue_async``,
``enqueue_many``, ``ctx.enqueue`` and a typed handle's ``.options()``; the
well-formed calls beside them are not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from postbox import errors, prepare
from postbox.registry import Registry, task

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """\
import psycopg
from postbox import JobContext, enqueue, enqueue_async, enqueue_many, task


@task()
def send_receipt(ctx: object, order_id: int) -> None: ...


def produce(conn: psycopg.Connection, aconn: psycopg.AsyncConnection) -> None:
    enqueue(conn, "send_receipt", {"order_id": 1}, priority=9, delay=60, dedup_key="k")  # fine
    send_receipt.options(queue="mail", keep_result=True).enqueue(conn, order_id=1)  # fine
    enqueue(conn, "send_receipt", {"order_id": 1}, priorty=9)
    enqueue(conn, "send_receipt", {"order_id": 1}, priority="high")
    enqueue_many(conn, [], max_attempts="3")
    send_receipt.options(delay="soon")


async def follow_up(ctx: JobContext, aconn: psycopg.AsyncConnection) -> None:
    await enqueue_async(aconn, "send_receipt", {"order_id": 1}, run_at="tomorrow")
    await ctx.enqueue("send_receipt", {"order_id": 1}, dedupkey="k")
"""


def test_mypy_reports_a_wrong_option_name_or_type_at_every_call_site(tmp_path: Path) -> None:
    checked = tmp_path / "produce.py"
    checked.write_text(SNIPPET)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(checked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors_found = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [int(line.split(":")[1]) for line in errors_found]
    assert lines == [12, 13, 14, 15, 19, 20], done.stdout
    text = "\n".join(errors_found)
    assert 'Unexpected keyword argument "priorty" for "enqueue"' in text
    assert 'Argument "priority" to "enqueue" has incompatible type "str"' in text
    assert 'Argument "max_attempts" to "enqueue_many" has incompatible type "str"' in text
    assert 'Argument "delay" to "options" of "Task" has incompatible type "str"' in text
    assert 'Argument "run_at" to "enqueue_async" has incompatible type "str"' in text
    assert 'Unexpected keyword argument "dedupkey" for "enqueue" of "JobContext"' in text


def test_an_option_the_type_checker_did_not_see_is_refused_at_run_time() -> None:
    registry = Registry()

    @task(registry=registry)
    def noop(ctx: object) -> None: ...

    with pytest.raises(errors.InvalidOptionError) as info:
        prepare("noop", {}, registry=registry, priorty=9)  # type: ignore[call-arg]
    assert info.value.field == "priorty"
    assert "unknown enqueue option 'priorty'" in str(info.value)
