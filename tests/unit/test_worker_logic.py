"""The worker's pure decisions, without servers: backoff, outcomes, XAUTOCLAIM replies, capacity."""

from __future__ import annotations

import asyncio

import pytest

from postbox.errors import InvalidArgsError, PermanentError, RetryLater, UnknownTaskError
from postbox.results import JobResult, _from_row
from postbox.worker.capacity import Capacity
from postbox.worker.delivery import parse_delivery
from postbox.worker.outcomes import MAX_ERROR_CHARS, JobTimeout, failed, next_delay, sanitize
from postbox.worker.reclaimer import parse_autoclaim
from postbox.worker.worker import new_worker_id


def test_backoff_doubles_from_base_and_caps() -> None:
    delays = [next_delay(a, 1.0, 300.0, 0.2, lambda: 0.5) for a in range(1, 12)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def test_backoff_jitter_is_plus_minus_the_fraction() -> None:
    assert next_delay(3, 1.0, 300.0, 0.2, lambda: 0.0) == pytest.approx(3.2)
    assert next_delay(3, 1.0, 300.0, 0.2, lambda: 1.0) == pytest.approx(4.8)
    assert next_delay(1, 0.0, 300.0, 0.2, lambda: 0.0) == 0.0


def test_sanitize_makes_one_short_line() -> None:
    text = sanitize("a\nb\r\tc\x00d" + "x" * 1000)
    assert text.startswith("a b c d") and len(text) == MAX_ERROR_CHARS and "\n" not in text


def _fail(exc: BaseException, attempt: int = 1, max_attempts: int = 3) -> tuple[str, str, float, str | None]:
    out = failed(exc, attempt=attempt, max_attempts=max_attempts, base=1.0, cap=10.0, jitter=0.0, rand=lambda: 0.5)
    return out.state, out.kind, out.delay, out.error_class


def test_failures_retry_with_backoff_until_attempts_run_out() -> None:
    assert _fail(RuntimeError("x"), 1) == ("retrying", "retry", 1.0, "RuntimeError")
    assert _fail(RuntimeError("x"), 2) == ("retrying", "retry", 2.0, "RuntimeError")
    assert _fail(JobTimeout("slow"), 2) == ("retrying", "retry", 2.0, "JobTimeout")
    assert _fail(RuntimeError("x"), 3) == ("dead", "dead", 0.0, "RuntimeError")


def test_retry_later_uses_its_delay_and_counts_as_an_attempt() -> None:
    assert _fail(RetryLater(7.5), 1) == ("retrying", "retry", 7.5, "RetryLater")
    assert _fail(RetryLater(7.5), 3) == ("dead", "dead", 0.0, "RetryLater")


@pytest.mark.parametrize("exc", [PermanentError("no"), InvalidArgsError("bad"), UnknownTaskError("who")])
def test_permanent_errors_are_dead_at_once(exc: Exception) -> None:
    state, kind, _, cls = _fail(exc, 1, 5)
    assert (state, kind, cls) == ("dead", "dead", type(exc).__name__)


def test_dead_outcome_records_the_failure_as_result() -> None:
    out = failed(PermanentError("card declined"), attempt=1, max_attempts=5, base=1, cap=1, jitter=0, rand=lambda: 0)
    assert out.result == '{"error":{"class":"PermanentError","message":"card declined"}}'


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
