"""What a run's end means for its job: the pure decisions, no I/O.

One module for the worker (:mod:`postbox.worker.executor`,
:mod:`postbox.worker.completer`) and for the inline runs of
:mod:`postbox.testing`, so both decide alike:

- **classification**: a run that returned, or raised, becomes an :class:`Outcome`
  (the job's next state, the attempt's recorded outcome, the error class, message
  and bounded traceback to record). :data:`PERMANENT` errors end in the dead
  letters at once; any other failure is retried until the attempts run out;
  ``RetryLater(seconds)`` counts as an attempt like any failure;
  ``Snooze(seconds)`` does not, up to the task's ``max_snoozes`` (:func:`snoozed`);
  ``AlreadyProcessed`` is a duplicate, ``JobCancelled`` a cancellation.
- **the retry delay**: ``min(max, base * 2^(attempt-1))`` with ±jitter
  (:func:`next_delay`); the task's :class:`RetryPolicy` overrides the settings
  field by field (:func:`backoff`); ``rand`` is a parameter so a test pins it.
- **the outcome parameters**: the parameters of ``sql.JOB_RECORD_OUTCOMES`` for
  a batch of outcomes (:func:`outcome_params`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from postbox import pgarray
from postbox.errors import (
    AlreadyProcessed,
    InvalidArgsError,
    JobCancelled,
    PermanentError,
    RetryLater,
    Snooze,
    UnknownTaskError,
)
from postbox.settings import Settings
from postbox.text import safe_text, safe_value, traceback_text

MAX_ERROR_CHARS = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")

# Exceptions that send a job to the dead letters at once.
PERMANENT: tuple[type[BaseException], ...] = (PermanentError, InvalidArgsError, UnknownTaskError)


class JobTimeout(Exception):
    """The handler ran past its timeout (retryable)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Per-task override of the retry backoff; ``None`` fields fall back to settings."""

    base_delay: float | None = None
    max_delay: float | None = None
    jitter: float | None = None


@dataclass(frozen=True, slots=True)
class Backoff:
    """The retry backoff in force for one task: the policy's fields, else the settings'."""

    base: float
    cap: float
    jitter: float

    def delay(self, attempt: int, rand: Callable[[], float]) -> float:
        return next_delay(attempt, self.base, self.cap, self.jitter, rand)


NO_BACKOFF = Backoff(0.0, 0.0, 0.0)


def backoff(policy: RetryPolicy, settings: Settings) -> Backoff:
    """The backoff a task with ``policy`` retries with under ``settings``."""
    return Backoff(
        base=policy.base_delay if policy.base_delay is not None else settings.retry_base_delay,
        cap=policy.max_delay if policy.max_delay is not None else settings.retry_max_delay,
        jitter=policy.jitter if policy.jitter is not None else settings.retry_jitter,
    )


def next_delay(attempt: int, base: float, cap: float, jitter: float, rand: Callable[[], float]) -> float:
    """Backoff before the next attempt after ``attempt`` (1-based) failed."""
    capped = min(cap, base * 2 ** max(0, attempt - 1))
    return max(0.0, capped * (1 + jitter * (2 * rand() - 1)))


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


def duplicate() -> Outcome:
    """The run found its effects already committed by an earlier run (``AlreadyProcessed``)."""
    return Outcome("succeeded", "duplicate")


def dead(cls: str, message: str) -> Outcome:
    cls = sanitize(cls)
    text = sanitize(message)
    return Outcome("dead", "dead", result=failure_result(cls, text), error_class=cls, error=text)


def cancelled() -> Outcome:
    return Outcome("cancelled", "cancelled", error_class="JobCancelled", error="cancelled on request")


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


def failed(
    exc: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    backoff: Backoff,
    rand: Callable[[], float],
) -> Outcome:
    """The outcome of a run whose handler raised ``exc``: dead, or retrying after a delay."""
    cls = error_class(exc)
    message = error_text(exc)
    decided = isinstance(exc, RetryLater | Snooze)
    trace = None if decided else traceback_text(exc)  # a RetryLater or a Snooze is a decision, not a bug
    if isinstance(exc, PERMANENT):
        outcome = dead(cls, message)
    elif attempt >= max_attempts:
        outcome = dead(cls, f"attempts exhausted ({attempt}/{max_attempts}): {message}")
    else:
        delay = exc.seconds if isinstance(exc, RetryLater | Snooze) else backoff.delay(attempt, rand)
        outcome = Outcome("retrying", "retry", delay=delay, error_class=cls, error=sanitize(message))
    outcome.traceback = trace
    return outcome


def snoozed(
    exc: Snooze,
    *,
    snoozes: int,
    max_snoozes: int,
    attempt: int,
    max_attempts: int,
    backoff: Backoff,
    rand: Callable[[], float],
) -> Outcome:
    """The outcome of a run that snoozed, its job having snoozed ``snoozes`` times before.

    Within ``max_snoozes``: the job waits ``exc.seconds`` and its attempt budget
    grows by one (``JOB_RECORD_OUTCOMES`` adds one to ``max_attempts`` for an
    attempt whose outcome is ``snoozed``), so the attempt this run was counted
    for is given back. Past it: a failure like ``RetryLater``, counted, so the
    attempts bound the job (retrying after ``exc.seconds``, or dead).
    """
    reason = f": {exc.reason}" if exc.reason else ""
    if snoozes < max_snoozes:
        note = f"snoozed for {exc.seconds:g}s ({snoozes + 1} of {max_snoozes}){reason}"
        return Outcome("retrying", "snoozed", delay=exc.seconds, error_class="Snooze", error=sanitize(note))
    over = Snooze(exc.seconds, f"snooze limit reached ({max_snoozes}), counted as an attempt{reason}")
    return failed(over, attempt=attempt, max_attempts=max_attempts, backoff=backoff, rand=rand)


def raised(
    exc: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    backoff: Backoff,
    rand: Callable[[], float],
) -> Outcome:
    """The outcome of a run that raised ``exc``, whatever it is: a duplicate, a cancellation, or a failure."""
    if isinstance(exc, AlreadyProcessed):
        return duplicate()
    if isinstance(exc, JobCancelled):
        return cancelled()
    return failed(exc, attempt=attempt, max_attempts=max_attempts, backoff=backoff, rand=rand)


# --- the outcome parameters -----------------------------------------------------------


class Attempt(Protocol):
    """What :func:`outcome_params` needs of a claimed attempt (the worker's ``Job`` is one)."""

    @property
    def id(self) -> int: ...

    @property
    def attempt(self) -> int: ...


A = TypeVar("A", bound=Attempt)


def outcome_params(
    worker_id: str,
    items: Sequence[tuple[A, Outcome]],
    result_ttl: Callable[[A], float],
    *,
    notify: bool = True,
    also_notify: Sequence[int] = (),
) -> dict[str, Any]:
    """The parameters of ``sql.JOB_RECORD_OUTCOMES`` for these attempts' outcomes.

    ``result_ttl`` is asked only when the batch keeps a result. With ``notify``
    the finished ids (and ``also_notify``: jobs whose success committed in their
    own ctx.transaction()) wake result waiters.
    """
    # Array literals (jobs/pgarray.py), and NULL for an array the batch does not use
    # (delays without a retry, results and their TTLs without a result): dumping
    # nine lists element by element was most of the cost of writing an outcome.
    outcomes = [outcome for _, outcome in items]
    results = pgarray.texts_or_null([outcome.result for outcome in outcomes])
    retrying = any(outcome.state == "retrying" for outcome in outcomes)
    return {
        "worker": worker_id,
        "ids": pgarray.ints(job.id for job, _ in items),
        "attempts": pgarray.ints(job.attempt for job, _ in items),
        "states": pgarray.words(outcome.state for outcome in outcomes),
        "delays": pgarray.floats(outcome.delay for outcome in outcomes) if retrying else None,
        "results": results,
        "result_ttls": None if results is None else pgarray.floats(result_ttl(job) for job, _ in items),
        "error_classes": pgarray.texts_or_null([outcome.error_class for outcome in outcomes]),
        "errors": pgarray.texts_or_null([outcome.error for outcome in outcomes]),
        "tracebacks": pgarray.texts_or_null([outcome.traceback for outcome in outcomes]),
        "outcomes": pgarray.words(outcome.kind for outcome in outcomes),
        "notify": notify,
        "also_notify": ",".join(map(str, also_notify)) if (notify and also_notify) else None,
    }
