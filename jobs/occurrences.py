"""When a schedule fires: pure functions of a schedule's timing and a clock value.

No I/O and no clock of their own: every function takes ``now`` (or ``after``)
as an aware datetime, so tests pin daylight-saving days and leap days without
waiting. Times come back in UTC.

- A **cron** schedule's occurrences are computed in its IANA time zone by
  cronsim, which follows Debian cron on daylight-saving changes: a time that
  does not exist on the spring-forward day (``30 2 * * *`` in Berlin or New
  York) fires once, at the first instant after the gap (03:00); a time that
  exists twice on the fall-back day fires once, at its first instance.
- An **interval** schedule fires every ``every`` seconds on a grid anchored at
  the Unix epoch (``every=60`` fires at each whole minute, UTC): occurrence
  times never drift, whoever computes them and whenever.

:func:`due` decides what a tick enqueues, by the catch-up policy (see
``docs/periodic-jobs.md``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from postbox.errors import InvalidOptionError

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_POLICIES: tuple[str, ...] = ("latest", "all", "none")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TINY = timedelta(microseconds=1)


@dataclass(frozen=True)
class Timing:
    """How a schedule fires: a cron expression in a zone, or a fixed interval (exactly one of them)."""

    cron: str | None = None
    every: float | None = None  # seconds
    tz: str = "UTC"
    catch_up: CatchUp = "latest"
    max_catch_up: int = 100  # bound of the `all` policy
    grace: float = 60.0  # an occurrence less late than this is on time, never "missed"

    def __post_init__(self) -> None:
        check_timing(self)


def check_timing(timing: Timing) -> None:
    """Raise :class:`InvalidOptionError` unless ``timing`` is usable."""
    if (timing.cron is None) == (timing.every is None):
        raise InvalidOptionError("a schedule needs exactly one of cron= or every=", field="cron")
    if timing.cron is not None:
        if not isinstance(timing.cron, str):
            raise InvalidOptionError(f"cron must be a string, got {timing.cron!r}", field="cron")
        try:
            CronSim(timing.cron, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise InvalidOptionError(f"invalid cron expression {timing.cron!r}: {exc}", field="cron") from None
    if timing.every is not None and (
        isinstance(timing.every, bool)
        or not isinstance(timing.every, int | float)
        or not math.isfinite(timing.every)
        or timing.every < 1
    ):
        raise InvalidOptionError(f"every must be a number of seconds >= 1, got {timing.every!r}", field="every")
    zone(timing.tz)
    if timing.catch_up not in CATCH_UP_POLICIES:
        raise InvalidOptionError(
            f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {timing.catch_up!r}", field="catch_up"
        )
    if isinstance(timing.max_catch_up, bool) or not isinstance(timing.max_catch_up, int) or timing.max_catch_up < 1:
        raise InvalidOptionError(
            f"max_catch_up must be an integer >= 1, got {timing.max_catch_up!r}", field="max_catch_up"
        )
    if not isinstance(timing.grace, int | float) or not math.isfinite(timing.grace) or timing.grace < 0:
        raise InvalidOptionError(f"grace must be seconds >= 0, got {timing.grace!r}", field="grace")


@functools.lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; :class:`InvalidOptionError` if there is none.

    Cached: ``ZoneInfo`` keeps only a few zones alive itself, and reading one
    from disk costs more than the rest of a tick's work for a schedule.
    """
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidOptionError(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin", field="tz"
        ) from None


def _aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware")
    return value.astimezone(UTC)


def next_after(timing: Timing, after: datetime) -> datetime:
    """The first occurrence strictly after ``after`` (UTC)."""
    after = _aware(after, "after")
    if timing.every is not None:
        steps = math.floor((after - EPOCH).total_seconds() / timing.every) + 1
        found = EPOCH + timedelta(seconds=steps * timing.every)
        return found if found > after else found + timedelta(seconds=timing.every)
    assert timing.cron is not None
    for found in _forward(timing.cron, timing.tz, after):
        return found
    raise AssertionError("unreachable: a cron expression always has a next occurrence")


def _forward(cron: str, tz: str, after: datetime) -> Iterator[datetime]:
    """Occurrences strictly after ``after``, ascending, in UTC (each strictly later than the last)."""
    last = after
    for found in CronSim(cron, after.astimezone(zone(tz))):
        moment = found.astimezone(UTC)
        # In a repeated hour cronsim can answer a wall time whose first instance is already past.
        if moment > last:
            last = moment
            yield moment


def _upcoming(timing: Timing, after: datetime) -> Iterator[datetime]:
    """Occurrences strictly after ``after``, ascending, in UTC (intervals and cron alike)."""
    if timing.cron is not None:
        yield from _forward(timing.cron, timing.tz, after)
        return
    moment = next_after(timing, after)
    assert timing.every is not None
    while True:
        yield moment
        moment = moment + timedelta(seconds=timing.every)


def _backward(timing: Timing, upto: datetime) -> Iterator[datetime]:
    """Occurrences at or before ``upto``, descending, in UTC."""
    if timing.every is not None:
        steps = math.floor((upto - EPOCH).total_seconds() / timing.every)
        while True:
            yield EPOCH + timedelta(seconds=steps * timing.every)
            steps -= 1
    assert timing.cron is not None
    last = upto + TINY
    for found in CronSim(timing.cron, (upto + TINY).astimezone(zone(timing.tz)), reverse=True):
        moment = found.astimezone(UTC)
        if moment < last:
            last = moment
            yield moment


@dataclass(frozen=True)
class Due:
    """What one tick does for one schedule."""

    enqueue: list[datetime]  # occurrence times to enqueue, ascending
    skipped: int  # missed occurrences the catch-up policy left out
    cursor: datetime  # the latest occurrence considered (enqueued or skipped): never looked at again
    next_run: datetime  # the first occurrence after the cursor


def due(timing: Timing, cursor: datetime, now: datetime) -> Due:
    """The occurrences in ``(cursor, now]`` to enqueue under the schedule's catch-up policy.

    An occurrence less than ``grace`` seconds old is on time and always
    enqueued (a leader failover of a few seconds loses nothing). Older ones
    were missed while no relay ran; the policy picks among them: ``all`` the
    most recent ``max_catch_up``, ``latest`` the most recent one unless an
    on-time occurrence follows it, ``none`` nothing.
    """
    cursor = _aware(cursor, "cursor")
    now = _aware(now, "now")
    horizon = now - timedelta(seconds=timing.grace)
    # The usual case, from one forward iterator: nothing due, or exactly one occurrence.
    ahead = _upcoming(timing, cursor)
    first = next(ahead)
    if first > now:
        return Due(enqueue=[], skipped=0, cursor=cursor, next_run=first)
    second = next(ahead)
    if second > now:
        if first >= horizon or timing.catch_up != "none":
            return Due(enqueue=[first], skipped=0, cursor=first, next_run=second)
        return Due(enqueue=[], skipped=1, cursor=first, next_run=second)
    on_time: list[datetime] = []
    missed: list[datetime] = []
    more_missed = False
    wanted = {"all": timing.max_catch_up, "latest": 1, "none": 0}[timing.catch_up]
    latest: datetime | None = None
    for moment in _backward(timing, now):
        if moment <= cursor:
            break
        if latest is None:
            latest = moment
        if moment >= horizon:
            on_time.append(moment)
            continue
        if len(missed) < wanted:
            missed.append(moment)
            continue
        more_missed = True
        break
    if timing.catch_up == "latest" and on_time:
        missed = []
        more_missed = bool(more_missed or _any_missed(timing, cursor, horizon))
    enqueue = sorted(missed + on_time)
    skipped = _count_skipped(timing, cursor, horizon, len(missed)) if more_missed else 0
    new_cursor = latest if latest is not None else cursor
    return Due(enqueue=enqueue, skipped=skipped, cursor=new_cursor, next_run=next_after(timing, new_cursor))


def _any_missed(timing: Timing, cursor: datetime, horizon: datetime) -> bool:
    return next_after(timing, cursor) < horizon


def _count_skipped(timing: Timing, cursor: datetime, horizon: datetime, taken: int, cap: int = 10_000) -> int:
    """Missed occurrences in ``(cursor, horizon)`` not enqueued (counted up to ``cap``, for the log)."""
    if timing.every is not None:
        first = next_after(timing, cursor)
        if first >= horizon:
            return 0
        total = math.ceil((horizon - first).total_seconds() / timing.every)
        return max(0, total - taken)
    assert timing.cron is not None
    total = 0
    for moment in _forward(timing.cron, timing.tz, cursor):
        if moment >= horizon or total >= cap:
            break
        total += 1
    return max(0, total - taken)
