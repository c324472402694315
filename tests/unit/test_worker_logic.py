"""The worker's pure decisions, without servers: XAUTOCLAIM replies, deliveries, capacity.

The outcome decisions (backoff, classification) are tested in tests/unit/test_outcomes.py.
"""

from __future__ import annotations

import asyncio

import pytest

from postbox.results import JobResult, _from_row
from postbox.streams import decode_entry, encode_entry
from postbox.worker.capacity import Capacity
from postbox.worker.delivery import parse_delivery, parse_entry
from postbox.worker.reclaimer import parse_autoclaim
from postbox.worker.worker import new_worker_id


def test_xautoclaim_replies_of_two_and_three_elements() -> None:
    raw2 = [b"0-0", [[b"1-0", [b"id", b"7"]], [b"2-0", None]]]
    assert parse_autoclaim(raw2) == (b"0-0", [(b"1-0", {b"id": b"7"}), (b"2-0", None)], [])
    parsed3 = [b"5-0", [(b"3-0", {b"id": b"8"})], [b"4-0"]]
    assert parse_autoclaim(parsed3) == (b"5-0", [(b"3-0", {b"id": b"8"})], [b"4-0"])
    with pytest.raises(ValueError):
        parse_autoclaim([b"0-0"])


def test_parse_delivery_refuses_entries_that_are_not_jobs() -> None:
    # the nine-field envelope of older relays (some fields left out) is still read
    good = parse_delivery("p:{q}:p5", b"1-0", {b"id": b"3", b"task": b"t", b"queue": b"q", b"priority": b"5"})
    assert (good.job_id, good.task, good.args, good.priority) == (3, "t", "{}", 5)
    for bad in (
        {b"hello": b"world"},
        {b"m": b"3 1 5 10", b"a": b"{}"},  # numbers missing
        {b"m": b"3 1 5 10 11 9 q t", b"a": b"{}"},  # a queue longer than what follows
        {b"m": b"x 1 5 10 11 1 qt", b"a": b"{}"},
    ):
        with pytest.raises(ValueError):
            parse_delivery("p:{q}:p5", b"1-0", bad)


def envelope(headers: str) -> dict[bytes, bytes]:
    """A job's envelope as this version's relay writes it, with names holding spaces, as Redis returns it."""
    entry = dict(
        job_id=9, task="shop.send mail", args='{"a": [1, 2]}', headers=headers, attempt=2,
        queue="q 1 2", priority=7, enqueued_ms=1_795_963_847_407, published_ms=1_795_963_847_499,
    )  # fmt: skip
    return {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in encode_entry(**entry).items()}  # type: ignore[arg-type]


@pytest.mark.parametrize("headers", ["{}", '{"k": "v w"}'])
def test_the_envelope_round_trips_names_with_spaces_and_both_shapes_decode_alike(headers: str) -> None:
    fields = envelope(headers)
    got = parse_delivery("p:{q 1 2}:p7", b"5-0", fields)
    assert (got.job_id, got.task, got.args, got.headers, got.queue, got.priority, got.enq_ms) == (
        9, "shop.send mail", '{"a": [1, 2]}', headers, "q 1 2", 7, 1_795_963_847_407,
    )  # fmt: skip
    old = {
        b"id": b"9", b"task": b"shop.send mail", b"args": b'{"a": [1, 2]}', b"headers": headers.encode(),
        b"attempt": b"2", b"queue": b"q 1 2", b"priority": b"7", b"enq": b"1795963847407", b"pub": b"1795963847499",
    }  # fmt: skip
    assert decode_entry(fields) == decode_entry(old) == {
        "id": 9, "task": "shop.send mail", "args": '{"a": [1, 2]}', "headers": headers, "attempt": 2,
        "queue": "q 1 2", "priority": 7, "enq": 1_795_963_847_407, "pub": 1_795_963_847_499,
    }  # fmt: skip
    assert parse_delivery("p:{q 1 2}:p7", b"5-0", old) == got


def flat(fields: dict[bytes, bytes]) -> list[bytes]:
    """An entry's fields as a read returns them: field, value, field, value..."""
    return [part for pair in fields.items() for part in pair]


@pytest.mark.parametrize("headers", ["{}", '{"k": "v w"}'])
def test_an_entry_read_in_place_is_the_delivery_its_fields_make(headers: str) -> None:
    fields = envelope(headers)
    got = parse_entry("p:{q 1 2}:p7", b"5-0", flat(fields))
    assert got == parse_delivery("p:{q 1 2}:p7", b"5-0", fields)
    assert (got.job_id, got.task, got.args, got.headers, got.queue, got.priority, got.enq_ms) == (
        9, "shop.send mail", '{"a": [1, 2]}', headers, "q 1 2", 7, 1_795_963_847_407,
    )  # fmt: skip
    # the same fields in another order, and the nine-field envelope: read through parse_delivery
    reordered = {b"a": fields[b"a"], b"m": fields[b"m"], **({b"h": fields[b"h"]} if b"h" in fields else {})}
    assert parse_entry("p:{q 1 2}:p7", b"5-0", flat(reordered)) == got
    old = {b"id": b"3", b"task": b"t", b"queue": b"q", b"priority": b"5"}
    assert parse_entry("p:{q}:p5", b"1-0", flat(old)) == parse_delivery("p:{q}:p5", b"1-0", old)


@pytest.mark.parametrize(
    "parts",
    [
        [b"hello", b"world"],
        [b"m", b"3 1 5 10", b"a", b"{}"],  # numbers missing
        [b"m", b"3 1 5 10 11 9 q t", b"a", b"{}"],  # a queue longer than what follows
        [b"m", b"x 1 5 10 11 1 qt", b"a", b"{}"],
        [b"m", b"3 1 5 10 11 1 qt", b"a", b"\xff"],  # args that are not UTF-8
        [b"m", b"3 1 5 10 11 1 qt", b"a"],  # a field without its value
    ],
)
def test_parse_entry_refuses_entries_that_are_not_jobs(parts: list[bytes]) -> None:
    with pytest.raises(ValueError):
        parse_entry("p:{q}:p5", b"1-0", parts)


async def test_capacity_never_hands_out_more_than_free() -> None:
    cap = Capacity(3)
    assert cap.take(5) == 3 and cap.take(1) == 0
    waiter = asyncio.create_task(cap.wait_free())
    await asyncio.sleep(0)
    assert not waiter.done()
    cap.release(1)
    await asyncio.wait_for(waiter, 1)
    assert cap.free == 1


def test_worker_ids_are_random_8_hex() -> None:
    ids = {new_worker_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 15 and i.startswith("worker-") and int(i[7:], 16) >= 0 for i in ids)


def test_result_rows() -> None:
    assert _from_row(1, None) is None
    assert _from_row(1, ("succeeded", 42, None, None)) == JobResult(1, "succeeded", 42)
    dead = _from_row(2, ("dead", {"error": {"class": "E", "message": "m"}}, "E", "m"))
    assert dead == JobResult(2, "dead", None, "E", "m") and dead.finished and not dead.ok
    assert _from_row(3, ("running", None, None, None)) == JobResult(3, "running")
