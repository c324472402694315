"""A running job's progress: the value a handler reports and when it is written (pure logic, no I/O).

A handler calls ``ctx.progress(done, total=None, note=None)`` as often as it
likes; the worker (:mod:`postbox.worker.context`) writes the value to the
job's row (``outbox.progress``, migration 0010) at most once per
:data:`MIN_INTERVAL` seconds, and always writes the last value before the run's
outcome. :class:`Throttle` makes that decision, with the clock as a parameter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from postbox.errors import PostboxError
from postbox.text import safe_text

MIN_INTERVAL = 1.0  # seconds between two writes of one run's progress
MAX_NOTE_CHARS = 200


class ProgressError(PostboxError, ValueError):
    """A value ``ctx.progress()`` cannot take: the message names the argument."""


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a run got: ``done`` of ``total`` (None: unknown), with an optional short note."""

    done: float
    total: float | None = None
    note: str | None = None

    @property
    def fraction(self) -> float | None:
        """``done / total`` in 0..1, or None when the total is unknown."""
        if self.total is None:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    def as_json(self) -> dict[str, Any]:
        """What the row's ``progress`` column holds (and the API and the events show)."""
        return {"done": _number(self.done), "total": _number(self.total), "note": self.note}


def progress(done: Any, total: Any = None, note: Any = None) -> Progress:
    """A checked :class:`Progress`; raises :class:`ProgressError` naming the bad argument."""
    if not _finite(done) or done < 0:
        raise ProgressError(f"progress: done must be a finite number >= 0, got {done!r}")
    if total is not None and (not _finite(total) or total <= 0):
        raise ProgressError(f"progress: total must be a finite number > 0 or None, got {total!r}")
    if note is not None:
        if not isinstance(note, str):
            raise ProgressError(f"progress: note must be a string or None, got {type(note).__name__}")
        note = safe_text(" ".join(note.split()))[:MAX_NOTE_CHARS] or None
    return Progress(float(done), None if total is None else float(total), note)


def from_json(value: Any) -> Progress | None:
    """The :class:`Progress` a row's column holds (None: none reported, or not one of ours)."""
    if not isinstance(value, dict):
        return None
    try:
        return progress(value.get("done"), value.get("total"), value.get("note"))
    except ProgressError:
        return None


class Throttle:
    """When to write a run's progress: the first report at once, then at most once per ``interval``.

    :meth:`report` takes each new value and says whether to write now;
    :meth:`due_at_end` gives the last value when it was not written yet.
    """

    def __init__(self, interval: float = MIN_INTERVAL, clock: Callable[[], float] | None = None) -> None:
        self._interval = interval
        self._clock = clock or time.monotonic
        self._last_write: float | None = None
        self.latest: Progress | None = None
        self.written: Progress | None = None

    def report(self, value: Progress) -> bool:
        """Remember ``value``; True when it should be written now (the caller then calls :meth:`wrote`)."""
        self.latest = value
        now = self._clock()
        return self._last_write is None or now - self._last_write >= self._interval

    def wrote(self, value: Progress) -> None:
        self.written = value
        self._last_write = self._clock()

    def due_at_end(self) -> Progress | None:
        """The last value, when it differs from the last one written."""
        return self.latest if self.latest is not None and self.latest != self.written else None


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _number(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if value.is_integer() and abs(value) < 2**53 else value
