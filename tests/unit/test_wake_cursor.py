"""The wake-up stream's cursor and the missed wake-up check (postbox.worker.wake), and the wake-up entry's fields."""

from __future__ import annotations

import pytest

from postbox.streams import parse_wake, stream_key, wake_entry
from postbox.worker.wake import WakeCursor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


STREAMS = ["p:{a}:p9", "p:{a}:p1"]


def test_a_drained_read_of_every_stream_sets_the_cursor_for_that_list_only() -> None:
    cursor = WakeCursor(off_for=300)
    assert cursor.cursor_for(STREAMS) is None
    assert cursor.read_every_stream(STREAMS, 3, drained=False, tail=None) is False  # the count reached
    assert cursor.cursor_for(STREAMS) is None
    assert cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0") is False
    assert cursor.cursor_for(STREAMS) == "5-0"
    assert cursor.cursor_for(list(STREAMS)) is None  # another list (the paused queues changed)
    cursor.woke("7-0")
    assert cursor.cursor_for(STREAMS) == "7-0"
    assert cursor.read_every_stream(STREAMS, 0, drained=True, tail=None) is False  # not asked: no cursor
    assert cursor.cursor_for(STREAMS) is None


def test_entries_found_after_a_timeout_with_no_new_wake_up_entry_turn_the_stream_off_for_a_while() -> None:
    clock = Clock()
    cursor = WakeCursor(off_for=300, monotonic=clock)
    cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0")
    cursor.timed_out()
    assert cursor.read_every_stream(STREAMS, 1, drained=True, tail="5-0") is False  # once: maybe a coincidence
    assert cursor.on() and cursor.cursor_for(STREAMS) == "5-0"
    cursor.timed_out()
    assert cursor.read_every_stream(STREAMS, 50, drained=False, tail=None) is False  # counted, not judged yet
    assert cursor.read_every_stream(STREAMS, 1, drained=True, tail="5-0") is True  # twice in a row
    assert not cursor.on() and cursor.cursor_for(STREAMS) is None
    clock.now += 299
    assert cursor.read_every_stream(STREAMS, 0, drained=True, tail="6-0") is False
    assert cursor.cursor_for(STREAMS) is None  # still off
    clock.now += 1
    assert cursor.on() and cursor.cursor_for(STREAMS) == "6-0"


@pytest.mark.parametrize(
    ("found", "tail", "same_list"),
    [
        (0, "5-0", True),  # nothing found after the timeout
        (1, "6-0", True),  # found with a wake-up entry written after the timeout
        (1, "5-0", False),  # found in a queue resumed since (written before the cursor)
    ],
)
def test_what_is_not_a_missed_wake_up(found: int, tail: str, same_list: bool) -> None:
    cursor = WakeCursor(off_for=300)
    cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0")
    cursor.timed_out()
    streams = STREAMS if same_list else [*STREAMS, "p:{b}:p5"]
    assert cursor.read_every_stream(streams, found, drained=True, tail=tail) is False
    assert cursor.on() and cursor.cursor_for(streams) == tail


def test_a_timeout_is_judged_by_the_first_drained_read_after_it_only() -> None:
    cursor = WakeCursor(off_for=300)
    cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0")
    cursor.timed_out()
    cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0")  # found nothing: the timeout is judged
    assert cursor.read_every_stream(STREAMS, 2, drained=True, tail="5-0") is False  # no timeout before it


@pytest.mark.parametrize("between", ["a wake-up", "a clean timeout"])
def test_two_suspect_timeouts_count_only_in_a_row(between: str) -> None:
    """A wake-up, or a timeout after which nothing came with no wake-up entry, clears the first suspicion."""
    cursor = WakeCursor(off_for=300)
    cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0")
    cursor.timed_out()
    assert cursor.read_every_stream(STREAMS, 1, drained=True, tail="5-0") is False
    if between == "a wake-up":
        cursor.woke("6-0")
    else:
        cursor.timed_out()
        assert cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0") is False
    tail = cursor.cursor_for(STREAMS)
    cursor.timed_out()
    assert cursor.read_every_stream(STREAMS, 1, drained=True, tail=tail) is False  # the first again, not the second
    assert cursor.on()


def test_a_wake_up_after_a_timeout_clears_it() -> None:
    """Entries found once a wake-up came (its streams read up to the cursor it moved to) are no missed wake-up."""
    cursor = WakeCursor(off_for=300)
    cursor.read_every_stream(STREAMS, 0, drained=True, tail="5-0")
    cursor.timed_out()
    cursor.woke("6-0")
    assert cursor.read_every_stream(STREAMS, 1, drained=True, tail="6-0") is False
    assert cursor.on() and cursor.cursor_for(STREAMS) == "6-0"


def test_a_wake_up_entry_names_each_queue_once_with_its_priorities() -> None:
    fields = wake_entry([("mail", 9), ("mail", 5), ("sms", 0), ("mail", 9)])
    assert fields == [b"mail", b"95", b"sms", b"0"]
    assert parse_wake("p", fields) == {
        stream_key("p", "mail", 9),
        stream_key("p", "mail", 5),
        stream_key("p", "sms", 0),
    }
    assert parse_wake("p", [f.decode() for f in fields]) == parse_wake("p", fields)
    for bad in ([b"mail"], [b"mail", b"x"], [b"mail", b"95", b"sms"]):
        with pytest.raises(ValueError):
            parse_wake("p", bad)
