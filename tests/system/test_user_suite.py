"""A user's own pytest suite with the postbox.testing plugin: it catches a missing enqueue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = 'pytest_plugins = ["postbox.testing"]\n'

PYTEST_INI = "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"

SHOP = """
from postbox import enqueue_async, task


@task(queue="mail")
async def send_receipt(ctx, order_id: int) -> None:
    async with ctx.transaction() as conn:
        await conn.execute("INSERT INTO receipts (order_id) VALUES (%s)", (order_id,))


async def place_order(conn, order_id: int, *, buggy: bool = False) -> None:
    await conn.execute("INSERT INTO orders (id) VALUES (%s)", (order_id,))
    if not buggy:
        await send_receipt.enqueue_async(conn, order_id=order_id)
"""

TESTS = """
from postbox.testing import assert_enqueued_async, run_enqueued

from shop import place_order, send_receipt


async def make_tables(conn):
    await conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    await conn.execute("CREATE TABLE receipts (order_id int)")


async def test_an_order_sends_its_receipt(postbox_conn):
    await make_tables(postbox_conn)
    await place_order(postbox_conn, 1)
    await assert_enqueued_async(postbox_conn, send_receipt, args={"order_id": 1}, count=1)
    [run] = await run_enqueued(postbox_conn)
    assert run.state == "succeeded"
    cur = await postbox_conn.execute("SELECT order_id FROM receipts")
    assert await cur.fetchall() == [(1,)]


async def test_the_buggy_path_is_caught(postbox_conn):
    await make_tables(postbox_conn)
    await place_order(postbox_conn, 1)
    await place_order(postbox_conn, 2, buggy=True)
    await assert_enqueued_async(postbox_conn, send_receipt, args={"order_id": 2})
"""


def test_the_plugin_catches_a_missing_enqueue_in_a_user_suite(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text(PYTEST_INI)
    (tmp_path / "shop.py").write_text(SHOP)
    (tmp_path / "test_shop.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTBOX_", "PYTEST"))}
    env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_shop.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout
    assert "FAILED test_shop.py::test_the_buggy_path_is_caught" in done.stdout
    assert (
        "AssertionError: expected at least one job(s) send_receipt args={'order_id': 2}, found 0; enqueued:"
        in done.stdout
    )
    assert " send_receipt queue=mail priority=5 args={'order_id': 1} state=pending" in done.stdout
    # Each test's transaction was rolled back: the suite left nothing in the database.
    import psycopg

    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)
        assert conn.execute("SELECT to_regclass('public.orders')").fetchone() == (None,)
