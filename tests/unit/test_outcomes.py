"""The outcome decisions (postbox.outcomes), without servers: backoff, classification, the outcome parameters."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from postbox.errors import (
    AlreadyProcessed,
    InvalidArgsError,
    JobCancelled,
    PermanentError,
    RetryLater,
    UnknownTaskError,
)
from postbox.outcomes import (
    MAX_ERROR_CHARS,
    NO_BACKOFF,
    Backoff,
    JobTimeout,
    Outcome,
    RetryPolicy,
    backoff,
    dead,
    failed,
    next_delay,
    outcome_params,
    raised,
    sanitize,
    storable,
    succeeded,
)
from postbox.settings import Settings

STEADY = Backoff(base=1.0, cap=10.0, jitter=0.0)


def test_backoff_doubles_from_base_and_caps() -> None:
    delays = [next_delay(a, 1.0, 300.0, 0.2, lambda: 0.5) for a in range(1, 12)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def test_backoff_jitter_is_plus_minus_the_fraction() -> None:
    assert next_delay(3, 1.0, 300.0, 0.2, lambda: 0.0) == pytest.approx(3.2)
    assert next_delay(3, 1.0, 300.0, 0.2, lambda: 1.0) == pytest.approx(4.8)
    assert next_delay(1, 0.0, 300.0, 0.2, lambda: 0.0) == 0.0


def test_a_task_policy_overrides_the_settings_field_by_field() -> None:
    settings = Settings(retry_base_delay=2.0, retry_max_delay=60.0, retry_jitter=0.1)
    assert backoff(RetryPolicy(), settings) == Backoff(2.0, 60.0, 0.1)
    assert backoff(RetryPolicy(max_delay=5.0), settings) == Backoff(2.0, 5.0, 0.1)
    assert backoff(RetryPolicy(base_delay=0.0, max_delay=0.0, jitter=0.0), settings) == NO_BACKOFF
    assert backoff(RetryPolicy(jitter=0.0), settings).delay(3, lambda: 0.9) == 8.0


def test_sanitize_makes_one_short_line() -> None:
    text = sanitize("a\nb\r\tc\x00d" + "x" * 1000)
    assert text.startswith("a b c d") and len(text) == MAX_ERROR_CHARS and "\n" not in text


def _fail(exc: BaseException, attempt: int = 1, max_attempts: int = 3) -> tuple[str, str, float, str | None]:
    out = failed(exc, attempt=attempt, max_attempts=max_attempts, backoff=STEADY, rand=lambda: 0.5)
    return out.state, out.kind, out.delay, out.error_class


def test_failures_retry_with_backoff_until_attempts_run_out() -> None:
    assert _fail(RuntimeError("x"), 1) == ("retrying", "retry", 1.0, "RuntimeError")
    assert _fail(RuntimeError("x"), 2) == ("retrying", "retry", 2.0, "RuntimeError")
    assert _fail(JobTimeout("slow"), 2) == ("retrying", "retry", 2.0, "JobTimeout")
    assert _fail(RuntimeError("x"), 3) == ("dead", "dead", 0.0, "RuntimeError")


def test_retry_later_uses_its_delay_counts_as_an_attempt_and_keeps_no_traceback() -> None:
    assert _fail(RetryLater(7.5), 1) == ("retrying", "retry", 7.5, "RetryLater")
    assert _fail(RetryLater(7.5), 3) == ("dead", "dead", 0.0, "RetryLater")
    assert failed(RetryLater(1), attempt=1, max_attempts=3, backoff=STEADY, rand=lambda: 0.5).traceback is None


@pytest.mark.parametrize("exc", [PermanentError("no"), InvalidArgsError("bad"), UnknownTaskError("who")])
def test_permanent_errors_are_dead_at_once(exc: Exception) -> None:
    state, kind, _, cls = _fail(exc, 1, 5)
    assert (state, kind, cls) == ("dead", "dead", type(exc).__name__)


def test_a_failure_records_its_class_message_and_traceback() -> None:
    try:
        raise ValueError("bad\ninput")
    except ValueError as exc:
        out = failed(exc, attempt=1, max_attempts=3, backoff=STEADY, rand=lambda: 0.5)
    assert (out.error_class, out.error, out.result) == ("ValueError", "bad input", None)
    assert out.traceback is not None and "ValueError: bad" in out.traceback
    exhausted = failed(ValueError(""), attempt=3, max_attempts=3, backoff=STEADY, rand=lambda: 0.5)
    assert exhausted.error == "attempts exhausted (3/3): ValueError"  # an empty message: the class name


def test_dead_outcome_records_the_failure_as_result() -> None:
    out = failed(PermanentError("card declined"), attempt=1, max_attempts=5, backoff=STEADY, rand=lambda: 0)
    assert out.result == '{"error":{"class":"PermanentError","message":"card declined"}}'


def test_raised_classifies_duplicates_and_cancellations_too() -> None:
    def of(exc: BaseException) -> tuple[str, str, str | None]:
        out = raised(exc, attempt=1, max_attempts=3, backoff=STEADY, rand=lambda: 0.5)
        return out.state, out.kind, out.error_class

    assert of(AlreadyProcessed("done")) == ("succeeded", "duplicate", None)
    assert of(JobCancelled()) == ("cancelled", "cancelled", "JobCancelled")
    assert of(KeyError("k")) == ("retrying", "retry", "KeyError")
    assert of(PermanentError("no")) == ("dead", "dead", "PermanentError")


def test_a_kept_result_is_jsonb_text_and_an_unkept_one_is_none() -> None:
    assert succeeded({"a": [1, 2]}, keep_result=True).result == '{"a":[1,2]}'
    assert succeeded({"a": 1}, keep_result=False).result is None


def test_the_storable_form_keeps_the_decision_and_drops_the_result() -> None:
    out = storable(Outcome("retrying", "retry", delay=4.0, error_class="E", error="bad\x00text"))
    assert (out.state, out.kind, out.delay, out.result) == ("retrying", "retry", 4.0, None)
    assert out.error == "bad text (the outcome's text could not be stored)"
    gone = storable(dead("E", "m"))
    assert orjson.loads(gone.result or "") == {"error": {"class": "E", "message": gone.error}}


@dataclass
class _Attempt:
    id: int
    attempt: int


def test_outcome_params_are_array_literals_with_null_for_unused_columns() -> None:
    items = [(_Attempt(7, 1), succeeded(None, keep_result=False)), (_Attempt(9, 2), dead("E", "m"))]
    asked: list[int] = []

    def ttl(job: _Attempt) -> float:
        asked.append(job.id)
        return 60.0

    params = outcome_params("worker-1", items, ttl, also_notify=[3, 4])
    assert params == {
        "worker": "worker-1",
        "ids": "{7,9}",
        "attempts": "{1,2}",
        "states": "{succeeded,dead}",
        "delays": None,  # nothing retries
        "results": [None, '{"error":{"class":"E","message":"m"}}'],
        "result_ttls": "{60.0,60.0}",
        "error_classes": [None, "E"],
        "errors": [None, "m"],
        "tracebacks": None,
        "outcomes": "{succeeded,dead}",
        "notify": True,
        "also_notify": "3,4",
    }
    assert asked == [7, 9]


def test_outcome_params_without_results_ask_no_ttl() -> None:
    retry = Outcome("retrying", "retry", delay=2.5, error_class="E", error="m")

    def ttl(job: _Attempt) -> float:
        raise AssertionError("no result: no TTL")

    params = outcome_params("w", [(_Attempt(1, 1), retry)], ttl, notify=False, also_notify=[5])
    assert (params["delays"], params["results"], params["result_ttls"]) == ("{2.5}", None, None)
    assert (params["notify"], params["also_notify"]) == (False, None)


# --- snooze ------------------------------------------------------------------------------


def test_a_snooze_within_the_bound_is_free_and_past_it_counts() -> None:
    from postbox.errors import Snooze
    from postbox.outcomes import snoozed

    within = snoozed(
        Snooze(30, "wait"), snoozes=0, max_snoozes=1, attempt=1, max_attempts=1, backoff=NO_BACKOFF, rand=lambda: 0.5
    )
    assert (within.state, within.kind, within.delay, within.error_class, within.error) == (
        "retrying",
        "snoozed",
        30.0,
        "Snooze",
        "snoozed for 30s (1 of 1): wait",
    )
    # Past the bound: like RetryLater, counted; on the last attempt, dead.
    counted = snoozed(
        Snooze(30), snoozes=1, max_snoozes=1, attempt=1, max_attempts=2, backoff=NO_BACKOFF, rand=lambda: 0.5
    )
    assert (counted.state, counted.kind, counted.delay, counted.traceback) == ("retrying", "retry", 30.0, None)
    last = snoozed(
        Snooze(30), snoozes=1, max_snoozes=1, attempt=2, max_attempts=2, backoff=NO_BACKOFF, rand=lambda: 0.5
    )
    assert (last.state, last.kind, last.error) == (
        "dead",
        "dead",
        "attempts exhausted (2/2): snooze limit reached (1), counted as an attempt",
    )
    none_allowed = snoozed(
        Snooze(0), snoozes=0, max_snoozes=0, attempt=1, max_attempts=3, backoff=NO_BACKOFF, rand=lambda: 0.5
    )
    assert none_allowed.kind == "retry"


@pytest.mark.parametrize("seconds", [-1, True, "5", float("nan"), float("inf"), 366 * 86_400 + 1])
def test_a_snooze_needs_a_sane_number_of_seconds(seconds: object) -> None:
    from postbox.errors import Snooze

    with pytest.raises(ValueError, match=r"Snooze seconds must be a number in 0\.\.31622400"):
        Snooze(seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, True, 10_001, "3"])
def test_max_snoozes_is_checked_at_registration(bad: object) -> None:
    from postbox.errors import InvalidOptionError
    from postbox.registry import Registry, task

    with pytest.raises(InvalidOptionError, match=r"max_snoozes must be an integer 0\.\.10000"):

        @task(registry=Registry(), max_snoozes=bad)  # type: ignore[call-overload]
        async def snoozer(ctx: object) -> None: ...
