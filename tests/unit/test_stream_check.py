"""The stream check's calls and replies (relay/stream_check.py); the script itself runs on a real Redis in
tests/integration/test_stream_check.py."""

from __future__ import annotations

from postbox.relay.stream_check import Look, StreamReport, looks, report, sliced


def test_one_call_per_queue_with_a_must_exist_flag_and_the_mark_of_each_stream() -> None:
    known = {"p:{a}:p5", "p:{b}:p0"}
    marks = {"p:{a}:p5": (7, 1), "p:{a}:p9": (1700000000000, 12)}
    assert looks(known, marks) == [
        Look(["p:{a}:p5", "p:{a}:p9"], [b"1", b"7-1", b"0", b"1700000000000-12"]),
        Look(["p:{b}:p0"], [b"1", b""]),
    ]
    assert looks(set(), {}) == []


def test_the_replies_name_the_streams_found_wrong_in_order() -> None:
    calls = [Look(["p:{a}:p5", "p:{a}:p9"], []), Look(["p:{b}:p0", "p:{b}:p1"], [])]
    replies = [[[], [2], 0], [[2, 1], [1], 1]]
    assert report(calls, replies) == StreamReport(
        missing=["p:{b}:p0", "p:{b}:p1"], lost=["p:{a}:p9", "p:{b}:p0"], refused=True
    )
    assert report(calls, [[[], [], 0], [[], [], 0]]) == StreamReport()


def test_a_slice_takes_whole_queues_after_the_last_stream_looked_at() -> None:
    streams = sorted(f"p:{{{q}}}:p{p}" for q in "abc" for p in (0, 1, 2))
    assert sliced(streams, None, 4) == ["p:{a}:p0", "p:{a}:p1", "p:{a}:p2", "p:{b}:p0", "p:{b}:p1", "p:{b}:p2"]
    assert sliced(streams, "p:{b}:p2", 4) == ["p:{c}:p0", "p:{c}:p1", "p:{c}:p2"]
    assert sliced(streams, "p:{a}:p2", 3) == ["p:{b}:p0", "p:{b}:p1", "p:{b}:p2"]
    assert sliced(streams, "p:{c}:p2", 3) == []
    assert sliced(streams, None, None) == streams
    assert sliced(streams, "p:{a}:p0", None) == streams[1:]
    known = {"p:{a}:p0", "p:{b}:p0", "p:{c}:p0"}
    assert looks(known, {"p:{b}:p1": (3, 4)}, after="p:{a}:p0", limit=1) == [
        Look(["p:{b}:p0", "p:{b}:p1"], [b"1", b"", b"0", b"3-4"])
    ]
