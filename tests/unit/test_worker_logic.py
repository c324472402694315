"""The worker's pure decisions, without servers: XAUTOCLAIM replies, deliveries, capacity.

The outcome decisions (backoff, classification) are tested in tests/unit/test_outcomes.py.
"""

from __future__ import annotations

import asyncio

import pytest

from postbox.results import JobResult, _from_row
from postbox.worker.capacity import Capacity
from postbox.worker.delivery import parse_delivery
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
    good = parse_delivery("p:{q}:p5", b"1-0", {b"id": b"3", b"task": b"t", b"queue": b"q", b"priority": b"5"})
    assert (good.job_id, good.task, good.args, good.priority) == (3, "t", "{}", 5)
    with pytest.raises(ValueError):
        parse_delivery("p:{q}:p5", b"1-0", {b"hello": b"world"})


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
