"""What @task returns: the handler, still callable, with enqueue methods checked against its signature."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from postbox import InvalidArgsError, InvalidPriorityError
from postbox.handle import Task
from tests.harness.tasks import core as tasks_core

ROWS = "SELECT task, queue, priority, args, dedup_key, available_at > now() FROM postbox.outbox ORDER BY id"


async def test_the_handle_is_still_the_handler() -> None:
    assert isinstance(tasks_core.send_welcome, Task)
    assert tasks_core.send_welcome.__name__ == "send_welcome"
    assert tasks_core.send_welcome.name == "send_welcome" and tasks_core.send_welcome.spec.queue == "mail"
    assert await tasks_core.send_welcome(None, 3) is None  # a unit test's direct call


def test_enqueue_with_keyword_and_positional_args_and_bound_options(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        first = tasks_core.send_welcome.enqueue(conn, user_id=1)
        second = tasks_core.send_welcome.enqueue(conn, 2, "fr")
        urgent = tasks_core.send_welcome.options(priority=9, dedup_key="welcome-3", delay=600)
        third = urgent.enqueue(conn, user_id=3)
        assert urgent.enqueue(conn, user_id=3) == third  # the bound dedup key holds
        fourth = tasks_core.send_welcome.enqueue(conn, user_id=4)  # the options did not stick to the task
    assert first < second < third < fourth
    assert conn.execute(ROWS).fetchall() == [
        ("send_welcome", "mail", 7, {"user_id": 1}, None, False),
        ("send_welcome", "mail", 7, {"user_id": 2, "lang": "fr"}, None, False),
        ("send_welcome", "mail", 9, {"user_id": 3}, "welcome-3", True),
        ("send_welcome", "mail", 7, {"user_id": 4}, None, False),
    ]


async def test_enqueue_async(aconn: psycopg.AsyncConnection[Any]) -> None:
    job = await tasks_core.send_welcome.options(queue="other").enqueue_async(aconn, user_id=5)
    await aconn.commit()
    cur = await aconn.execute("SELECT id, queue, args FROM postbox.outbox")
    assert await cur.fetchall() == [(job, "other", {"user_id": 5})]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: tasks_core.send_welcome.enqueue(c, user_id="seven"), InvalidArgsError),
        (lambda c: tasks_core.send_welcome.enqueue(c, orderid=7), InvalidArgsError),
        (lambda c: tasks_core.send_welcome.enqueue(c, 1, "en", "extra"), InvalidArgsError),
        (lambda c: tasks_core.send_welcome.options(priority=12).enqueue(c, user_id=1), InvalidPriorityError),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(conn: psycopg.Connection[Any], call: Any, error: type) -> None:
    with pytest.raises(error):
        call(conn)
    conn.commit()
    assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)
