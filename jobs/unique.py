"""Unique jobs: at most one job per key of a task, for a period or while in given states.

Declared per task, ``@task(unique=Unique(period=3600, by=("customer_id",)))``.
A job's unique key is its task's name and the JSON of the arguments named in
``by`` (every argument when ``by`` is None), defaults filled in. Enqueueing a
job whose key an existing job holds (created within ``period``, and/or in one
of ``states``) inserts nothing and returns that job, flagged ``duplicate``.

The key and the lookup are computed in PostgreSQL (``{schema}.unique_claim``,
migration 0004), by the Python ``enqueue()``, the API and the SQL
``postbox.enqueue()`` alike: the same arguments give the same key whichever
path enqueues them. The lookup runs under a transaction-scoped advisory lock
on the key, so two concurrent enqueuers of one key serialise; see
docs/unique-jobs.md.

Two rules are built on it (docs/job-control.md): :func:`throttle` (at most one
job per key per window, the first wins: a rule with a period) and
:func:`debounce` (a burst of one key within a window is one job, run after the
window with the newest or merged arguments: ``unique_claim`` of migration 0010
gives the waiting job the new arguments under the key's lock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from postbox.errors import InvalidOptionError
from postbox.states import ALL_STATES

# The first key of the two-int advisory lock taken on a unique key (pg_advisory_xact_lock(class, hashtext(key))):
# apart from the relay's one-bigint leader lock and the other two-int classes (flow keys, queue depth).
LOCK_CLASS = 0x756E6971  # "uniq"
MAX_PERIOD = 366 * 86_400.0  # a year and a day: longer is a dedup key, not a period
MAX_BY = 32
DEBOUNCE_MODES = ("last", "merge")
WAITING = ("pending", "queued")  # a debounced job takes new arguments only while it waits


@dataclass(frozen=True)
class Unique:
    """A task's uniqueness rule.

    ``period``: seconds; a job is a duplicate of one with the same key created
    less than this long ago. ``states``: a job is a duplicate of one with the
    same key that is in one of these states (e.g. ``("pending", "queued",
    "running", "retrying")``: the key is free again once that job finishes).
    Both given: a duplicate only of a job matching both. ``by``: the names of
    the arguments that make the key (None: all of them).
    """

    period: float | None = None
    states: tuple[str, ...] | None = None
    by: tuple[str, ...] | None = None
    debounce: str | None = None  # "last" / "merge": see debounce(); None: a plain rule (or a throttle)

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", _check_period(self.period))
        object.__setattr__(self, "states", _check_states(self.states))
        object.__setattr__(self, "by", _check_by(self.by))
        if self.period is None and self.states is None:
            raise InvalidOptionError("a unique rule needs a period, states, or both", field="unique")
        if self.debounce is not None:
            if self.debounce not in DEBOUNCE_MODES:
                raise InvalidOptionError(
                    f"debounce must be one of {', '.join(DEBOUNCE_MODES)}, got {self.debounce!r}", field="debounce"
                )
            if self.period is None or self.states != WAITING:
                raise InvalidOptionError(
                    "a debounce rule has a window (period) and the waiting states only: use postbox.debounce()",
                    field="debounce",
                )

    def check_args(self, task: str, args_model: type[BaseModel]) -> None:
        """Refuse ``by`` names that are not arguments of the handler (unless it takes ``**kwargs``)."""
        if self.by is None or args_model.model_config.get("extra") == "allow":
            return
        unknown = [name for name in self.by if name not in args_model.model_fields]
        if unknown:
            raise InvalidOptionError(
                f"task {task!r}: unique by {unknown[0]!r}, which is not an argument of the handler",
                field="unique.by",
                details={"unknown": unknown, "arguments": sorted(args_model.model_fields)},
            )

    def rule(self, args_model: type[BaseModel]) -> dict[str, Any]:
        """The rule as stored in ``postbox.tasks.unique_rule`` and passed to ``{schema}.unique_claim``.

        ``defaults`` holds the JSON of the handler's argument defaults (those of
        the key's arguments), so that a job leaving an argument to its default
        and one passing the same value explicitly share a key, on every path.
        """
        rule: dict[str, Any] = {
            "period": self.period,
            "states": None if self.states is None else list(self.states),
            "by": None if self.by is None else list(self.by),
            "defaults": _defaults(args_model, self.by),
        }
        if self.debounce is not None:  # only then: a plain rule's JSON stays what it was
            rule["debounce"] = self.debounce
        return rule


def debounce(window: float, by: str | Iterable[str] | None = None, *, merge: bool = False) -> Unique:
    """Collapse a burst: jobs of the task with the same key within ``window`` seconds are one job.

    The first enqueue of a key creates a job due ``window`` seconds later (unless
    it gives its own ``delay`` / ``run_at``); each later enqueue of that key while
    the job still waits (pending or queued, within the window) changes nothing but
    its arguments — replaced by the newest (``merge=False``) or merged into them
    (``merge=True``: a JSON object merge, newest keys win) — and returns that job,
    flagged ``duplicate``. The worker reads the arguments in PostgreSQL when it
    claims the run, so the run gets the last ones committed. docs/job-control.md.
    """
    return Unique(period=window, states=WAITING, by=_as_names(by), debounce="merge" if merge else "last")


def throttle(window: float, by: str | Iterable[str] | None = None) -> Unique:
    """At most one job of the task per key per ``window`` seconds; the first wins.

    A later enqueue of the key within the window (from the first job's creation)
    returns that job, flagged ``duplicate``, and creates nothing: a unique rule
    with a period (docs/unique-jobs.md). docs/job-control.md.
    """
    return Unique(period=window, by=_as_names(by))


def _as_names(by: Any) -> Any:
    """``by`` as Unique takes it: one name bare, or a tuple (anything else is refused by Unique's check)."""
    if isinstance(by, Iterable) and not isinstance(by, str | bytes | dict):
        return tuple(by)
    return by


def rule_json(unique: Unique | None, args_model: type[BaseModel]) -> str | None:
    """The rule as JSON text (keys sorted), or None for a task without one."""
    if unique is None:
        return None
    return orjson.dumps(unique.rule(args_model), option=orjson.OPT_SORT_KEYS).decode()


def _check_period(period: object) -> float | None:
    if period is None:
        return None
    if isinstance(period, bool) or not isinstance(period, int | float):
        raise InvalidOptionError(f"unique period must be a number of seconds, got {period!r}", field="unique.period")
    seconds = float(period)
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_PERIOD:
        raise InvalidOptionError(
            f"unique period must be > 0 and at most {MAX_PERIOD:.0f} seconds, got {period!r}", field="unique.period"
        )
    return seconds


def _names(value: object, field: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)  # one name given bare
    if not isinstance(value, Iterable) or isinstance(value, bytes | dict):
        raise InvalidOptionError(f"{field} must be a tuple of names, got {value!r}", field=field)
    names = tuple(value)
    if not names:
        raise InvalidOptionError(f"{field} must not be empty (None means: not set)", field=field)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidOptionError(f"{field} holds {name!r}, not a name", field=field)
    if len(set(names)) != len(names):
        raise InvalidOptionError(f"{field} names something twice: {names!r}", field=field)
    return names


def _check_states(states: object) -> tuple[str, ...] | None:
    names = _names(states, "unique.states")
    if names is None:
        return None
    unknown = [name for name in names if name not in ALL_STATES]
    if unknown:
        raise InvalidOptionError(
            f"unique states: {unknown[0]!r} is not a job state (one of {', '.join(ALL_STATES)})",
            field="unique.states",
            details={"unknown": unknown, "states": list(ALL_STATES)},
        )
    return tuple(str(name) for name in names)  # a JobState member is stored as its plain word


def _check_by(by: object) -> tuple[str, ...] | None:
    names = _names(by, "unique.by")
    if names is not None and len(names) > MAX_BY:
        raise InvalidOptionError(f"unique by names at most {MAX_BY} arguments", field="unique.by")
    return names


def _defaults(args_model: type[BaseModel], by: tuple[str, ...] | None) -> dict[str, Any]:
    """The JSON of the argument defaults that can be known ahead (no default factories)."""
    out: dict[str, Any] = {}
    for name, info in args_model.model_fields.items():
        if (by is not None and name not in by) or info.is_required() or info.default_factory is not None:
            continue
        try:
            out[name] = to_jsonable_python(info.default)
        except PydanticSerializationError:
            continue  # not JSON: an argument left to it is not part of the key
    return out
