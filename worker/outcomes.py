"""What a run's end means for its job: pure decisions, no I/O.

A finished run becomes an :class:`Outcome`: the job's next state, the attempt's
recorded outcome, and for retries the delay. Backoff is
``min(max, base * 2^(attempt-1))`` with ±jitter; ``rand`` is a parameter so a
test pins it. ``RetryLater(seconds)`` counts as an attempt like any failure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from postbox.errors import InvalidArgsError, PermanentError, RetryLater, UnknownTaskError
from postbox.text import safe_text, safe_value, traceback_text

MAX_ERROR_CHARS = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")

# Exceptions that send a job to the dead letters at once.
PERMANENT: tuple[type[BaseException], ...] = (PermanentError, InvalidArgsError, UnknownTaskError)


class JobTimeout(Exception):
    """The handler ran past its timeout (retryable)."""


@dataclass(slots=True)
class Outcome:
    state: str  # the job's next state: succeeded, retrying, dead, cancelled (or "lost": nothing to record)
    kind: str  # the attempt's outcome: succeeded, retry, dead, cancelled, duplicate, lost
    delay: float = 0.0
    result: str | None = None  # JSON text stored in outbox.result
    error_class: str | None = None
    error: str | None = None
    committed: bool = False  # already recorded inside the handler's ctx.transaction()
    traceback: str | None = None  # the failed attempt's, bounded (attempt history only)

    @property
    def metric(self) -> str:
        return {"retry": "retried"}.get(self.kind, self.kind)


def next_delay(attempt: int, base: float, cap: float, jitter: float, rand: Callable[[], float]) -> float:
    """Backoff before the next attempt after ``attempt`` (1-based) failed."""
    capped = min(cap, base * 2 ** max(0, attempt - 1))
    return max(0.0, capped * (1 + jitter * (2 * rand() - 1)))


def sanitize(message: str) -> str:
    """One line, no control characters, no unencodable text, at most 500 characters."""
    text = safe_text(_CONTROL.sub(" ", message)).strip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text


def error_class(exc: BaseException) -> str:
    return sanitize(type(exc).__name__)


def error_text(exc: BaseException) -> str:
    """``str(exc)``, or its class name when empty or when ``__str__`` itself fails."""
    try:
        return str(exc) or error_class(exc)
    except Exception:
        return error_class(exc)


def encode_result(value: Any) -> str:
    """JSON text that PostgreSQL's jsonb accepts, whatever the handler returned.

    The fast path is orjson as is; a value it refuses (a lone surrogate, an
    integer beyond 64 bits, a non-string key) or whose text holds a NUL
    (``\\u0000``, refused by jsonb) is made safe first (:func:`postbox.text.safe_value`).
    """
    try:
        text = orjson.dumps(value, default=repr).decode()
    except (TypeError, ValueError):
        return orjson.dumps(safe_value(value)).decode()
    if "\\u0000" in text:
        return orjson.dumps(safe_value(value)).decode()
    return text


def failure_result(cls: str, message: str) -> str:
    return encode_result({"error": {"class": cls, "message": message}})


def succeeded(value: Any, *, keep_result: bool) -> Outcome:
    return Outcome("succeeded", "succeeded", result=encode_result(value) if keep_result else None)


def dead(cls: str, message: str) -> Outcome:
    cls = sanitize(cls)
    text = sanitize(message)
    return Outcome("dead", "dead", result=failure_result(cls, text), error_class=cls, error=text)


def storable(outcome: Outcome) -> Outcome:
    """``outcome`` as PostgreSQL surely takes it: same decision, no result, safe error text.

    Used for a row refused by the database (the completer's isolation): the
    job's next state and the attempt's outcome stay as decided.
    """
    cls = sanitize(outcome.error_class) if outcome.error_class else None
    note = "the outcome's text could not be stored"
    error = sanitize(f"{outcome.error} ({note})") if outcome.error else note
    result = failure_result(cls or "UnstorableOutcome", error) if outcome.state == "dead" else None
    return Outcome(outcome.state, outcome.kind, delay=outcome.delay, result=result, error_class=cls, error=error)


def cancelled() -> Outcome:
    return Outcome("cancelled", "cancelled", error_class="JobCancelled", error="cancelled on request")


def failed(
    exc: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    base: float,
    cap: float,
    jitter: float,
    rand: Callable[[], float],
) -> Outcome:
    """The outcome of a run that raised ``exc``."""
    cls = error_class(exc)
    message = error_text(exc)
    trace = None if isinstance(exc, RetryLater) else traceback_text(exc)  # a RetryLater is a decision, not a bug
    if isinstance(exc, PERMANENT):
        outcome = dead(cls, message)
    elif attempt >= max_attempts:
        outcome = dead(cls, f"attempts exhausted ({attempt}/{max_attempts}): {message}")
    else:
        delay = exc.seconds if isinstance(exc, RetryLater) else next_delay(attempt, base, cap, jitter, rand)
        outcome = Outcome("retrying", "retry", delay=delay, error_class=cls, error=sanitize(message))
    outcome.traceback = trace
    return outcome
