"""postbox.progress without servers: the checks on a reported value and when it is written."""

from __future__ import annotations

import pytest

from postbox.progress import Progress, ProgressError, Throttle, from_json, progress


def test_values_are_checked_and_notes_bounded() -> None:
    assert progress(3, 10, "  rows\n copied ") == Progress(3.0, 10.0, "rows copied")
    assert progress(7) == Progress(7.0, None, None)
    assert progress(1, 4).fraction == 0.25 and progress(9, 4).fraction == 1.0 and progress(1).fraction is None
    assert progress(0, 1, "x" * 500).note == "x" * 200
    assert progress(2, 3, "").note is None
    assert progress(5, 10, "n").as_json() == {"done": 5, "total": 10, "note": "n"}
    assert progress(2.5).as_json() == {"done": 2.5, "total": None, "note": None}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1,), "done must be a finite number >= 0"),
        ((float("nan"),), "done must be a finite number >= 0"),
        ((True,), "done must be a finite number >= 0"),
        (("3",), "done must be a finite number >= 0"),
        ((1, 0), "total must be a finite number > 0 or None"),
        ((1, float("inf")), "total must be a finite number > 0 or None"),
        ((1, 2, 3), "note must be a string or None"),
    ],
)
def test_bad_values_name_the_argument(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ProgressError, match=message):
        progress(*args)


def test_from_json_reads_the_column_and_ignores_what_is_not_ours() -> None:
    assert from_json({"done": 4, "total": 8, "note": "a", "attempt": 1}) == Progress(4.0, 8.0, "a")
    assert from_json(None) is None and from_json({"done": -1}) is None and from_json([1]) is None


def test_the_first_report_is_written_at_once_then_one_a_second_and_the_last_at_the_end() -> None:
    now = [100.0]
    throttle = Throttle(1.0, clock=lambda: now[0])
    assert throttle.due_at_end() is None
    first = progress(1)
    assert throttle.report(first) is True
    throttle.wrote(first)
    decisions = []
    for step in range(2, 40):
        now[0] += 0.1
        value = progress(step)
        due = throttle.report(value)
        decisions.append(due)
        if due:
            throttle.wrote(value)
    # 3.8 s of reports every 0.1 s after the first: three more writes, one per second.
    assert decisions.count(True) == 3
    assert throttle.due_at_end() == progress(39)
    throttle.wrote(progress(39))
    assert throttle.due_at_end() is None
