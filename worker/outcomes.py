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

    @property
    def metric(self) -> str:
        return {"retry": "retried"}.get(self.kind, self.kind)


def next_delay(attempt: int, base: float, cap: float, jitter: float, rand: Callable[[], float]) -> float:
    """Backoff before the next attempt after ``attempt`` (1-based) failed."""
    capped = min(cap, base * 2 ** max(0, attempt - 1))
    return max(0.0, capped * (1 + jitter * (2 * rand() - 1)))


def sanitize(message: str) -> str:
    """One line, no control characters, at most 500 characters."""
    text = _CONTROL.sub(" ", message).strip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text


def error_class(exc: BaseException) -> str:
    return type(exc).__name__


def encode_result(value: Any) -> str:
    return orjson.dumps(value, default=repr).decode()


def failure_result(cls: str, message: str) -> str:
    return encode_result({"error": {"class": cls, "message": message}})


def succeeded(value: Any, *, keep_result: bool) -> Outcome:
    return Outcome("succeeded", "succeeded", result=encode_result(value) if keep_result else None)


def dead(cls: str, message: str) -> Outcome:
    text = sanitize(message)
    return Outcome("dead", "dead", result=failure_result(cls, text), error_class=cls, error=text)


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
    message = str(exc) or cls
    if isinstance(exc, PERMANENT):
        return dead(cls, message)
    if attempt >= max_attempts:
        return dead(cls, f"attempts exhausted ({attempt}/{max_attempts}): {message}")
    if isinstance(exc, RetryLater):
        delay = exc.seconds
    else:
        delay = next_delay(attempt, base, cap, jitter, rand)
    return Outcome("retrying", "retry", delay=delay, error_class=cls, error=sanitize(message))
