"""Periodic jobs, declared in code: ``postbox.periodic(task, cron=... | every=..., ...)``.

::

    @task(queue="reports")
    def nightly_report(ctx, region: str) -> None: ...

    periodic(nightly_report, cron="0 3 * * *", tz="Europe/Berlin", args={"region": "eu"}, name="report-eu")
    periodic(nightly_report, cron="0 3 * * *", tz="America/New_York", args={"region": "us"}, name="report-us")
    periodic("cleanup", every=300)  # name defaults to the task's name

A declaration only records the schedule in a :class:`ScheduleBook` (no I/O).
Relays and workers synchronise the book of the modules they loaded into the
database when they start (:mod:`postbox.schedule_store`), and the leading relay
enqueues each occurrence exactly once. Args are validated against the task's
signature here, so a bad schedule fails at import, not at 3 a.m.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from postbox.errors import InvalidOptionError
from postbox.occurrences import CatchUp, Timing
from postbox.registry import Registry, check_priority, check_queue, default_registry

SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$")


class DuplicateScheduleError(InvalidOptionError):
    """Two different schedules declared under one name."""

    code = "DUPLICATE_SCHEDULE"


@dataclass(frozen=True)
class Schedule:
    """One declared schedule: a task, fixed args, when it fires, and where its jobs go."""

    name: str
    task: str
    timing: Timing
    args: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 5
    max_attempts: int = 5

    @property
    def expression(self) -> str:
        """The cron expression, or ``every <n>s`` (for lists and the API)."""
        if self.timing.cron is not None:
            return self.timing.cron
        return f"every {self.timing.every:g}s"


class ScheduleBook:
    """The schedules declared in this process, by name. One process-wide default instance."""

    def __init__(self) -> None:
        self._schedules: dict[str, Schedule] = {}

    def add(self, schedule: Schedule) -> Schedule:
        existing = self._schedules.get(schedule.name)
        if existing is not None and existing != schedule:
            raise DuplicateScheduleError(
                f"schedule {schedule.name!r} is already declared (for task {existing.task!r}): "
                "give each schedule its own name=",
                field="name",
            )
        self._schedules[schedule.name] = schedule
        return schedule

    def remove(self, name: str) -> None:
        self._schedules.pop(name, None)

    def all(self) -> list[Schedule]:
        return [self._schedules[name] for name in sorted(self._schedules)]

    def __len__(self) -> int:
        return len(self._schedules)

    def __contains__(self, name: object) -> bool:
        return name in self._schedules


default_schedules = ScheduleBook()


def periodic(
    task: str | Callable[..., Any],
    *,
    cron: str | None = None,
    every: float | None = None,
    tz: str = "UTC",
    args: Mapping[str, Any] | None = None,
    name: str | None = None,
    catch_up: CatchUp = "latest",
    max_catch_up: int = 100,
    grace: float = 60.0,
    queue: str | None = None,
    priority: int | None = None,
    registry: Registry | None = None,
    book: ScheduleBook | None = None,
) -> Schedule:
    """Declare a schedule of a registered ``@task``; returns it. Raises before recording anything.

    ``cron`` (5 fields: minute hour day month weekday) in the IANA zone
    ``tz``, or ``every`` seconds (>= 1, on a grid from the Unix epoch). ``name`` (default: the
    task's name) is the schedule's identity: keep it stable, or the old name is
    shown as removed and the new one starts afresh. ``catch_up``: what to do
    with occurrences missed while no relay ran (``latest``, ``all`` up to
    ``max_catch_up``, ``none``); an occurrence less than ``grace`` seconds late
    is never "missed". ``queue`` and ``priority`` default to the task's.
    """
    spec = (registry if registry is not None else default_registry).resolve(task)
    if spec.encrypted:  # the relay enqueues a schedule's jobs in SQL, without the keys (postbox.encryption)
        raise InvalidOptionError(
            f"task {spec.name!r} is encrypted: a schedule's jobs are enqueued by the relay, which holds no key,"
            " so their args would be stored in the clear and refused by the worker; schedule a plain task whose"
            " handler enqueues it",
            field="task",
        )
    schedule_name = spec.name if name is None else name
    if not isinstance(schedule_name, str):  # no repr: a 5,000-digit int has none
        raise InvalidOptionError(f"schedule name must be a string, got {type(schedule_name).__name__}", field="name")
    if not SCHEDULE_NAME_RE.match(schedule_name):
        raise InvalidOptionError(
            f"invalid schedule name {schedule_name!r}: must match {SCHEDULE_NAME_RE.pattern}", field="name"
        )
    timing = Timing(cron=cron, every=every, tz=tz, catch_up=catch_up, max_catch_up=max_catch_up, grace=grace)
    fixed = orjson.loads(spec.args_json(dict(args or {})))
    schedule = Schedule(
        name=schedule_name,
        task=spec.name,
        timing=timing,
        args=fixed,
        queue=check_queue(spec.queue if queue is None else queue),
        priority=check_priority(spec.priority if priority is None else priority),
        max_attempts=spec.max_attempts,
    )
    return (book if book is not None else default_schedules).add(schedule)
