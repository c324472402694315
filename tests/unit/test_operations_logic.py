"""Pure logic of the operations surface: cursors, attempt lives, the WebSocket buffer, CLI parsing, key check."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from postbox.app.admin.common import parse_duration, positive_id
from postbox.app.api.events_hub import ClientBuffer, EventPublisher
from postbox.app.api.state import key_matches
from postbox.app.services.checks import check_limit, check_queue_name, decode_cursor, encode_cursor
from postbox.app.services.errors import InvalidInputError
from postbox.app.services.jobs import ARCHIVE_STRIDE, history_entries, split_attempt
from postbox.events import decode


def test_cursor_round_trip_and_refusals() -> None:
    assert decode_cursor(encode_cursor(42)) == 42
    assert decode_cursor(encode_cursor(2**63 - 1)) == 2**63 - 1
    assert decode_cursor(None) is None and decode_cursor("") is None
    for bad in ("garbage", "djE6MA", "djI6NQ", "!!!", encode_cursor(5) + "x", "djE6LTE"):
        with pytest.raises(InvalidInputError) as info:
            decode_cursor(bad)
        assert info.value.details == {"field": "cursor"}


def test_limits_and_queue_names() -> None:
    assert check_limit(1) == 1 and check_limit(500) == 500
    for bad in (0, 501, True):
        with pytest.raises(InvalidInputError):
            check_limit(bad)
    assert check_queue_name("mail-1") == "mail-1"
    with pytest.raises(InvalidInputError) as info:
        check_queue_name("Mail")
    assert info.value.field == "queue"


def test_split_attempt_maps_archived_lives_back() -> None:
    assert split_attempt(3) == (3, None)
    assert split_attempt(1 - ARCHIVE_STRIDE) == (1, 1)
    assert split_attempt(5 - ARCHIVE_STRIDE) == (5, 1)
    assert split_attempt(2 - 2 * ARCHIVE_STRIDE) == (2, 2)
    assert split_attempt(999_999 - 3 * ARCHIVE_STRIDE) == (999_999, 3)


def _row(attempt: int, outcome: str | None) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "worker_id": "w",
        "started_at": None,
        "finished_at": None,
        "outcome": outcome,
        "error_class": None,
        "error": None,
    }


def test_history_orders_lives_and_numbers_the_current_one() -> None:
    rows = [
        _row(1, None),
        _row(2 - ARCHIVE_STRIDE, "dead"),
        _row(1 - ARCHIVE_STRIDE, "retry"),
        _row(1 - 2 * ARCHIVE_STRIDE, "dead"),
    ]
    got = [(e.life, e.attempt, e.outcome) for e in history_entries(rows)]
    assert got == [(1, 1, "retry"), (1, 2, "dead"), (2, 1, "dead"), (3, 1, None)]
    assert [(e.life, e.attempt) for e in history_entries([_row(1, "x"), _row(2, None)])] == [(1, 1), (1, 2)]


def _evt(n: int, type_: str = "started", job: int = 1) -> dict[str, Any]:
    return {"event_id": str(n), "type": type_, "job_id": job}


def test_buffer_drops_the_oldest_non_terminal_event_when_full() -> None:
    buf = ClientBuffer(cap=3)
    buf.push(_evt(1, "published"))
    buf.push(_evt(2, "succeeded"))
    buf.push(_evt(3, "started"))
    buf.push(_evt(4, "dead"))
    assert [e["event_id"] for e in buf.items] == ["2", "3", "4"]
    assert buf.dropped == 1 and not buf.overflowed
    buf.push(_evt(5, "succeeded"))
    assert [e["event_id"] for e in buf.items] == ["2", "4", "5"]


def test_buffer_drops_a_non_terminal_newcomer_when_only_terminal_events_are_held() -> None:
    buf = ClientBuffer(cap=2)
    buf.push(_evt(1, "dead"))
    buf.push(_evt(2, "succeeded"))
    buf.push(_evt(3, "started"))
    assert [e["event_id"] for e in buf.items] == ["1", "2"]
    assert buf.dropped == 1 and not buf.overflowed


def test_buffer_overflows_when_nothing_can_be_dropped() -> None:
    buf = ClientBuffer(cap=2)
    buf.push(_evt(1, "dead"))
    buf.push(_evt(2, "cancelled"))
    buf.push(_evt(3, "succeeded"))
    assert buf.overflowed
    buf.push(_evt(4, "started"))
    assert len(buf.items) == 2


def test_buffer_filter() -> None:
    buf = ClientBuffer(cap=5, accept=lambda e: e["job_id"] == 7)
    buf.push(_evt(1, job=6))
    buf.push(_evt(2, job=7))
    assert [e["event_id"] for e in buf.items] == ["2"]


async def test_buffer_next_returns_in_order_then_none_after_overflow() -> None:
    buf = ClientBuffer(cap=1)
    buf.push(_evt(1, "dead"))
    assert (await buf.next()) == _evt(1, "dead")
    buf.push(_evt(2, "dead"))
    buf.push(_evt(3, "dead"))
    assert await buf.next() is None


def test_key_comparison() -> None:
    assert key_matches("abc", "abc")
    assert not key_matches("abd", "abc")
    assert not key_matches(None, "abc")
    assert not key_matches("", "abc")
    assert not key_matches("ab\udcff", "abc")


def test_cli_parsers() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("30m") == 1800
    assert parse_duration("12h") == 43200
    assert parse_duration("7d") == 604800
    assert parse_duration("1.5h") == 5400
    for bad in ("", "-5", "7 days", "h"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)
    assert positive_id("12") == 12
    for bad in ("0", "-1", "x", str(2**63)):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_id(bad)


class _FailingRedis:
    def __init__(self) -> None:
        self.calls = 0

    async def publish(self, channel: str, data: bytes) -> int:
        self.calls += 1
        raise ConnectionError("down")


class _Redis:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, channel: str, data: bytes) -> int:
        self.sent.append((channel, data))
        return 1


async def test_event_publisher_mutes_after_a_failure() -> None:
    now = [100.0]
    redis = _FailingRedis()
    pub = EventPublisher(redis, "pfx", mute=5.0, clock=lambda: now[0])
    assert await pub.publish("enqueued", job_id=1, queue="q", task="t") is False
    assert await pub.publish("enqueued", job_id=2, queue="q", task="t") is False
    assert redis.calls == 1  # muted: the second call did not touch Redis
    now[0] = 105.1
    assert await pub.publish("enqueued", job_id=3, queue="q", task="t") is False
    assert redis.calls == 2


async def test_event_publisher_sends_on_the_events_channel() -> None:
    redis = _Redis()
    pub = EventPublisher(redis, "pfx")
    assert await pub.publish("cancelled", job_id=7, queue="q", task="t", attempt=2) is True
    channel, data = redis.sent[0]
    assert channel == "pfx:events"
    evt = decode(data)
    assert (evt["type"], evt["job_id"], evt["attempt"]) == ("cancelled", 7, 2)
