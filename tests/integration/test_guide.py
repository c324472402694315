"""docs/in-your-application.md runs as written: each example block is executed here and its effect checked."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from postbox.registry import default_registry
from postbox.relay import Relay
from tests.harness.wait import wait_until, wait_until_async
from tests.harness.worker import running_worker, worker_settings

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "in-your-application.md"


def block(name: str) -> str:
    """The fenced block whose first line is ``# guide: name`` (or ``-- guide: name``)."""
    text = GUIDE.read_text()
    match = re.search(rf"```(?:python|sql)\n(?:#|--) guide: {name}\n(.*?)```", text, re.S)
    assert match, f"no block 'guide: {name}' in {GUIDE.name}"
    return match.group(1)


def load(name: str, monkeypatch: pytest.MonkeyPatch, database_url: str) -> types.ModuleType:
    """Execute a block as a module of its own, as a user's file would be.

    The block's tasks go into a copy of the default registry that the test's end
    discards: a module no other process can import leaves no task behind (later
    tests list the registry's modules and hand them to child processes).
    """
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setattr(default_registry, "_tasks", dict(default_registry._tasks))
    module = types.ModuleType(f"guide_{name}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(block(name), f"{GUIDE}:{name}", "exec"), module.__dict__)
    return module


def committed(conn: Any, task: str) -> list[tuple[Any, ...]]:
    """The jobs of ``task`` that the guide's code committed: (id, queue, args, priority).

    The guide's blocks are application code: they commit their own transactions,
    so postbox.testing's helpers (the test's open transaction only) do not see
    their jobs; the outbox is read as it is.
    """
    rows = conn.execute(
        "SELECT id, queue, args, priority FROM postbox.outbox WHERE task = %s ORDER BY id", (task,)
    ).fetchall()
    conn.rollback()
    return rows


async def run_committed(settings: Any, conn: Any, queue: str, count: int) -> None:
    """Run the committed jobs of ``queue`` as production does (relay, worker) until ``count`` succeeded."""
    s = worker_settings(settings, queues=[queue])
    relay = Relay(s)
    relay_task = asyncio.create_task(relay.run())

    def succeeded() -> bool:
        [(n,)] = conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'").fetchall()
        conn.rollback()
        return bool(n == count)

    try:
        async with running_worker(s):
            await wait_until_async(succeeded, 30, message=f"{count} job(s) succeeded")
    finally:
        relay.stop()
        await asyncio.wait_for(relay_task, 10)


async def test_plain_psycopg(database_url: str, monkeypatch: pytest.MonkeyPatch, conn: Any, settings: Any) -> None:
    conn.execute("CREATE TABLE users (id serial PRIMARY KEY, email text, welcomed boolean NOT NULL DEFAULT false)")
    conn.commit()
    guide = load("psycopg", monkeypatch, database_url)
    user_id = guide.sign_up("ada@example.org")
    [(_, queue, args, priority)] = committed(conn, "welcome_user")
    assert (queue, args, priority) == ("mail", {"user_id": user_id}, 7)
    await run_committed(settings, conn, "mail", 1)
    assert conn.execute("SELECT welcomed FROM users WHERE id = %s", (user_id,)).fetchall() == [(True,)]


async def test_sqlalchemy_and_fastapi(
    database_url: str, monkeypatch: pytest.MonkeyPatch, conn: Any, settings: Any
) -> None:
    conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, total int, receipt_sent boolean NOT NULL DEFAULT false)")
    conn.commit()
    guide = load("sqlalchemy", monkeypatch, database_url)
    try:
        with TestClient(guide.app) as client:
            placed = client.post("/orders", params={"total": 42})
        assert placed.status_code == 200, placed.text
        order_id = placed.json()["id"]
        [(_, queue, args, _)] = committed(conn, "email_receipt")
        assert (queue, args) == ("mail", {"order_id": order_id})
        await run_committed(settings, conn, "mail", 1)
        assert conn.execute("SELECT receipt_sent FROM orders WHERE id = %s", (order_id,)).fetchall() == [(True,)]
    finally:
        guide.engine.dispose()


DJANGO_RUNNER = """
import sys, types
import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

info = conninfo_to_dict(sys.argv[1])
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": info["dbname"],
    "USER": info.get("user", ""), "HOST": info.get("host", ""), "PORT": info.get("port", "")}}, USE_TZ=True)
django.setup()
guide = types.ModuleType("guide_django")
sys.modules[guide.__name__] = guide
exec(compile(sys.stdin.read(), "guide:django", "exec"), guide.__dict__)
guide.bill("ACME")
"""


def test_django(database_url: str, conn: Any) -> None:
    conn.execute("CREATE TABLE invoices (id serial PRIMARY KEY, customer text)")
    conn.commit()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DJANGO_RUNNER), database_url],
        input=block("django"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    [(invoice_id,)] = conn.execute("SELECT id FROM invoices").fetchall()
    [(_, queue, args, _)] = committed(conn, "send_invoice")
    assert (queue, args) == ("mail", {"invoice_id": invoice_id})


def test_sql(conn: Any) -> None:
    conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, total int)")
    conn.execute(block("sql"))
    jobs = conn.execute("SELECT task, args, priority, available_at > now() FROM postbox.outbox ORDER BY id").fetchall()
    assert jobs == [("email_receipt", {"order_id": 1}, 5, False), ("email_receipt", {"order_id": 1}, 9, True)]


def test_testing(database_url: str, tmp_path: Path) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE customers (id int PRIMARY KEY)")
        admin.execute("CREATE TABLE coupons (customer_id int)")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["postbox.testing"]\n')
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    (tmp_path / "test_guide_example.py").write_text(block("testing"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTBOX_", "PYTEST"))}
    env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


async def test_sqlalchemy_handlers_commit_the_sessions_writes_with_the_job(
    database_url: str, monkeypatch: pytest.MonkeyPatch, conn: Any, settings: Any
) -> None:
    conn.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, balance int NOT NULL)")
    conn.execute("INSERT INTO accounts VALUES (1, 100)")
    conn.commit()
    guide = load("sqlalchemy-handlers", monkeypatch, database_url)
    guide.credit_account.enqueue(conn, account_id=1, amount=30)
    guide.debit_account.enqueue(conn, account_id=1, amount=5)
    conn.commit()
    s = worker_settings(settings, queues=["billing"])
    relay = Relay(s)
    relay_task = asyncio.create_task(relay.run())
    try:
        async with running_worker(s):
            await wait_until_async(
                lambda: (
                    conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'").fetchone() == (2,)
                ),
                30,
                message="both handlers succeeded",
            )
    finally:
        relay.stop()
        await asyncio.wait_for(relay_task, 10)
        guide.sessions.kw["bind"].dispose()  # the block's engines: their pooled connections closed now
        await guide.async_sessions.kw["bind"].dispose()
    assert conn.execute("SELECT balance FROM accounts").fetchall() == [(125,)]
    assert conn.execute("SELECT count(*) FROM postbox.processed_jobs").fetchone() == (2,)


DJANGO_HANDLERS_PRELUDE = """
import os
import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

info = conninfo_to_dict(os.environ["POSTBOX_DATABASE_URL"])
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": info["dbname"],
    "USER": info.get("user", ""), "HOST": info.get("host", ""), "PORT": info.get("port", "")}}, USE_TZ=True)
django.setup()
"""


def test_django_handlers_commit_the_orms_writes_with_the_job(
    conn: Any, child_env: dict[str, str], tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE billing_invoice (id bigint PRIMARY KEY, customer text, reminders int NOT NULL)")
    conn.execute("INSERT INTO billing_invoice VALUES (7, 'ACME', 0)")
    conn.commit()
    (tmp_path / "guide_django_handlers.py").write_text(
        textwrap.dedent(DJANGO_HANDLERS_PRELUDE) + block("django-handlers")
    )
    env = {**child_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    argv = ["--tasks", "guide_django_handlers", "--queues", "mail"]
    procs = [
        subprocess.Popen([sys.executable, "-m", "postbox.relay", "run"], env=env, cwd=ROOT),
        subprocess.Popen([sys.executable, "-m", "postbox.worker", "run", *argv], env=env, cwd=ROOT),
    ]
    try:
        conn.execute("SELECT postbox.enqueue('remind', '{\"invoice_id\": 7}', queue => 'mail')")
        conn.commit()
        wait_until(
            lambda: conn.execute("SELECT state FROM postbox.outbox").fetchone() == ("succeeded",),
            60,
            message="remind succeeded",
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
    assert conn.execute("SELECT reminders FROM billing_invoice").fetchall() == [(1,)]
    assert conn.execute("SELECT count(*) FROM postbox.processed_jobs").fetchone() == (1,)
