"""High-water marks per stream: how a lost tail is told from a healthy stream."""

from __future__ import annotations

import pytest

from postbox.relay.watermark import HighWater, parse_entry_id


def test_entry_ids_compare_by_milliseconds_then_sequence() -> None:
    assert parse_entry_id("1700000000000-3") == (1700000000000, 3)
    assert parse_entry_id(b"9-10") > parse_entry_id("9-9")  # not a string comparison
    assert parse_entry_id("10-0") > parse_entry_id("9-99")


@pytest.mark.parametrize("bad", ["", "12", "a-1", "1-b", "-1", "1-"])
def test_a_malformed_entry_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a stream entry id"):
        parse_entry_id(bad)


def test_the_mark_keeps_the_newest_id_per_stream_and_forgets_on_request() -> None:
    marks = HighWater()
    marks.record(["a", "a", "b"], ["5-1", "5-0", "3-0"])
    marks.record(["a"], ["4-0"])  # an older id never lowers the mark
    assert marks.snapshot() == {"a": (5, 1), "b": (3, 0)}
    marks.forget()
    assert marks.snapshot() == {}
