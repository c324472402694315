"""High-water marks per stream and the written counter: how a lost tail is told from a healthy stream."""

from __future__ import annotations

import pytest

from postbox.relay.watermark import HighWater, WriteCount, parse_entry_id


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


def test_the_written_counter_tells_a_loss_only_by_an_answer_lower_than_the_last_plus_the_batch() -> None:
    count = WriteCount()
    assert count.answered(3, 103) is False  # the first answer is the starting point, whatever it is
    assert count.answered(2, 105) is False
    assert count.answered(4, 112) is False  # higher: a batch whose answer was lost (a cut connection) was applied
    assert count.answered(1, 110) is True  # lower than 112 + 1: writes before this batch are gone
    assert count.answered(1, 111) is False  # and the short answer is the new starting point
    count.forget()
    assert count.answered(5, 5) is False  # after a recovery (or in a new term): a fresh start, even from zero
    assert count.answered(1, 1) is True  # a server that restarted empty answers from zero again


def test_the_written_counter_counts_once_a_batch_was_answered_and_until_it_is_forgotten() -> None:
    count = WriteCount()
    assert count.counting is False  # a new term: nothing answered yet (a look beside the publishing waits)
    count.answered(2, 2)
    assert count.counting is True
    count.forget()
    assert count.counting is False
