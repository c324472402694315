"""Every error postbox raises on purpose, and the handler control-flow signals.

Producer errors share one base, :class:`EnqueueError`, with one subclass per
case, so callers can catch all bad input at once or one case precisely.  Each
is raised before anything is written.
"""

from __future__ import annotations

from typing import Any


class PostboxError(Exception):
    """Base of every error postbox raises on purpose."""


class SettingsError(PostboxError):
    """A setting is missing or invalid; the message names it."""


class SchemaOutdatedError(PostboxError):
    """The database's postbox schema is older than this code needs, or was never
    migrated; the message names both revisions and says to run ``postbox migrate``."""


class TaskModuleError(SettingsError):
    """A module named in ``POSTBOX_TASKS`` / ``--tasks`` failed to import.

    The message names the module and the exception; ``details`` is the
    traceback of the import, which the CLIs print.
    """

    def __init__(self, module: str, cause: BaseException, details: str) -> None:
        super().__init__(f"POSTBOX_TASKS: cannot import {module}: {type(cause).__name__}: {cause}")
        self.module = module
        self.details = details


# --- producer ------------------------------------------------------------------


class EnqueueError(PostboxError, ValueError):
    """Bad input to enqueue: nothing was written."""

    code = "INVALID_JOB"

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.field = field
        self.details = details or {}


class UnknownTaskError(EnqueueError):
    code = "UNKNOWN_TASK"


class InvalidQueueError(EnqueueError):
    code = "INVALID_QUEUE"


class InvalidPriorityError(EnqueueError):
    code = "INVALID_PRIORITY"


class InvalidArgsError(EnqueueError):
    """Args are not a JSON object or do not fit the handler's signature."""

    code = "INVALID_ARGS"


class ArgsOutOfRangeError(InvalidArgsError):
    """A number in args that JSON or the worker cannot carry: an integer outside the
    signed 64-bit range, NaN or an infinity."""

    code = "ARGS_OUT_OF_RANGE"


class PayloadTooLargeError(EnqueueError):
    code = "PAYLOAD_TOO_LARGE"


class ScheduleConflictError(EnqueueError):
    """``delay`` and ``run_at`` given together, or an invalid schedule."""

    code = "INVALID_SCHEDULE"


class InvalidMaxAttemptsError(EnqueueError):
    code = "INVALID_MAX_ATTEMPTS"


class InvalidOptionError(EnqueueError):
    """Any other invalid enqueue option (headers, dedup key, expiry...)."""

    code = "INVALID_OPTION"


class QueueFullError(EnqueueError):
    """The queue already holds ``max_queue_depth`` waiting jobs: retry after ``retry_after`` seconds."""

    code = "QUEUE_FULL"

    def __init__(self, message: str, *, retry_after: int, details: dict[str, Any] | None = None):
        super().__init__(message, details=details)
        self.retry_after = retry_after


class DuplicateTaskError(PostboxError):
    """Two handlers registered under one task name."""


# --- handler outcomes ------------------------------------------------------------


class RetryLater(Exception):
    """Raised by a handler: run this job again after ``seconds``. Counts as an attempt."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        if seconds < 0:
            raise ValueError("RetryLater seconds must be >= 0")
        super().__init__(reason or f"retry in {seconds}s")
        self.seconds = float(seconds)


MAX_SNOOZE_SECONDS = 366 * 86_400  # a year and a day: what make_interval and the relay's wake take easily


class Snooze(Exception):
    """Raised (or returned) by a handler: "not yet", run this job again after ``seconds``.

    Unlike :class:`RetryLater`, a snooze does not consume an attempt: the job's
    attempt budget (``max_attempts``) grows by one with each snooze, so the run
    counter ``attempts`` still numbers the runs and the history keeps one row per
    run (outcome ``snoozed``). A task allows at most ``max_snoozes`` snoozes
    (``@task(max_snoozes=...)``, default 100); past them a snooze counts as an
    attempt, exactly like ``RetryLater``, so a job cannot snooze forever.
    """

    def __init__(self, seconds: float, reason: str = "") -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_SNOOZE_SECONDS:
            raise ValueError(f"Snooze seconds must be a number in 0..{MAX_SNOOZE_SECONDS}, got {seconds!r}")
        super().__init__(reason or f"snoozed for {seconds:g}s")
        self.seconds = float(seconds)
        self.reason = reason


class PermanentError(Exception):
    """Raised by a handler: the job can never succeed; it goes to the dead letters at once."""


class AlreadyProcessed(BaseException):
    """Raised on entering ``ctx.transaction()`` when this job's effects already committed.

    Not an :class:`Exception` subclass, so a handler's ``except Exception`` does
    not swallow it by accident; the worker catches it and records the delivery
    as a duplicate absorbed.
    """


class JobCancelled(BaseException):
    """Raised inside a running handler whose job was cancelled (cooperative cancellation)."""


class UnsupportedConnectionError(PostboxError, TypeError):
    """``enqueue()`` was given something it cannot write a job on (see :mod:`postbox.connections`)."""
