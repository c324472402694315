"""The one line a process prints when a server is not there: the URL without its password, the reason, the wait."""

from __future__ import annotations

import socket

import pytest

from postbox.startup import hide_password, wait_for_postgres, wait_for_redis


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
    ],
)
def test_the_password_is_never_shown(url: str, shown: str) -> None:
    assert hide_password(url) == shown


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Clock:
    """A clock that moves one second per reading: the waits give up after a known number of attempts."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_postgresql_that_refuses_connections_is_given_up_after_the_timeout() -> None:
    port = closed_port()
    line = wait_for_postgres(f"postgresql://app:s3cret@127.0.0.1:{port}/app", 0.0, clock=Clock())
    assert line == (
        f"cannot reach PostgreSQL at postgresql://app:***@127.0.0.1:{port}/app: Connection refused "
        "(1 attempt in 1.0 s; POSTBOX_START_TIMEOUT bounds the wait)"
    )


def test_redis_that_refuses_connections_is_given_up_after_the_timeout() -> None:
    port = closed_port()
    line = wait_for_redis(f"redis://127.0.0.1:{port}/0", 0.0, clock=Clock())
    assert line is not None
    assert line.startswith(f"cannot reach Redis at redis://127.0.0.1:{port}/0: ")
    assert "Connection refused" in line and line.endswith("(1 attempt in 1.0 s; POSTBOX_START_TIMEOUT bounds the wait)")
