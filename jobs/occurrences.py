"""When a schedule fires: pure functions of a schedule's timing and a clock value.

No I/O and no clock of their own: every function takes ``now`` (or ``after``)
as an aware datetime, so tests pin daylight-saving days and leap days without
waiting. Times come back in UTC.

- A **cron** schedule's occurrences are computed in its IANA time zone by
  cronsim, which follows Vixie/Debian cron on daylight-saving days, and so
  does postbox (``docs/periodic-jobs.md``, "Time zones and daylight saving"):

  - a **fixed-time** expression (neither the minute nor the hour field begins
    with ``*``: ``30 2 * * *``, ``0,30 1-3 * * *``, ``0-59/15 2 * * *``) runs
    the wall times that do not exist on the spring-forward day once, at the
    first instant after the gap (03:00), and a wall time that exists twice on
    the fall-back day once, at its first instance;
  - a **repeating** expression (the minute or the hour field begins with
    ``*``: ``*/15 * * * *``, ``0 * * * *``, ``*/30 1-3 * * *``) runs by the
    clock as it goes: a wall time inside the gap does not run, and one inside
    the repeated hour runs at both instances, so the cadence in elapsed time
    is kept (``*/15 2 * * *`` in Berlin runs 8 times on the fall-back day and
    not at all on the spring-forward day).

- An **interval** schedule fires every ``every`` seconds of elapsed time on a
  grid anchored at the Unix epoch (``every=60`` fires at each whole minute,
  UTC): occurrence times never drift, whoever computes them and whenever, and
  daylight saving changes nothing (``every=3600`` fires 25 times on Berlin's
  fall-back day, 23 times on its spring-forward day).

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


MAX_CRON_CHARS = 1000  # far beyond any real expression (every minute listed is ~170 characters)
MAX_ZONE_CHARS = 100  # the longest IANA name is about 30
MAX_EVERY = 366 * 86_400.0  # seconds: a longer period is a calendar matter, for cron
MAX_GRACE = 366 * 86_400.0
MAX_CATCH_UP = 10_000  # occurrences one tick may enqueue for one schedule under `all`


def _shown(value: object) -> str:
    """``repr(value)`` for an error message, kept short (a 5,000-digit int cannot even be repr'd)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _seconds(value: object, low: float, high: float) -> bool:
    """Whether ``value`` is a real number of seconds in ``[low, high]`` (NaN, inf and bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return low <= value <= high  # int against float compares exactly, with no conversion to overflow


def check_timing(timing: Timing) -> None:
    """Raise :class:`InvalidOptionError` naming the field unless ``timing`` is usable.

    Every bound is checked before a value reaches ``int()``, ``float()``,
    ``timedelta`` or the database, so no input gives anything but this error.
    """
    if (timing.cron is None) == (timing.every is None):
        raise InvalidOptionError("a schedule needs exactly one of cron= or every=", field="cron")
    if timing.cron is not None:
        check_cron(timing.cron)
    if timing.every is not None and not _seconds(timing.every, 1, MAX_EVERY):
        raise InvalidOptionError(
            f"every must be a number of seconds from 1 to {MAX_EVERY:.0f}, got {_shown(timing.every)}",
            field="every",
        )
    if not isinstance(timing.tz, str) or len(timing.tz) > MAX_ZONE_CHARS:
        raise InvalidOptionError(
            f"unknown time zone {_shown(timing.tz)}: use an IANA name such as Europe/Berlin", field="tz"
        )
    zone(timing.tz)
    if timing.catch_up not in CATCH_UP_POLICIES:
        raise InvalidOptionError(
            f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {_shown(timing.catch_up)}",
            field="catch_up",
        )
    if (
        isinstance(timing.max_catch_up, bool)
        or not isinstance(timing.max_catch_up, int)
        or not 1 <= timing.max_catch_up <= MAX_CATCH_UP
    ):
        raise InvalidOptionError(
            f"max_catch_up must be an integer from 1 to {MAX_CATCH_UP}, got {_shown(timing.max_catch_up)}",
            field="max_catch_up",
        )
    if not _seconds(timing.grace, 0, MAX_GRACE):
        raise InvalidOptionError(
            f"grace must be a number of seconds from 0 to {MAX_GRACE:.0f}, got {_shown(timing.grace)}",
            field="grace",
        )


def check_cron(cron: object) -> None:
    """Raise :class:`InvalidOptionError` (field ``cron``) unless ``cron`` is a 5-field expression cronsim accepts.

    Five fields only: cronsim would take a sixth (seconds) field, run it every
    second, and leave out the daylight-saving rule for it.
    """
    if not isinstance(cron, str):
        raise InvalidOptionError(f"cron must be a string, got {_shown(cron)}", field="cron")
    if len(cron) > MAX_CRON_CHARS:
        raise InvalidOptionError(f"cron expression longer than {MAX_CRON_CHARS} characters", field="cron")
    if len(cron.split()) != 5:
        raise InvalidOptionError(
            f"invalid cron expression {_shown(cron)}: needs 5 fields (minute hour day month weekday)", field="cron"
        )
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError, OverflowError) as exc:  # ValueError: int()'s digit limit, in cronsim
        raise InvalidOptionError(f"invalid cron expression {_shown(cron)}: {exc}", field="cron") from None


def dst_rule(cron: str) -> Literal["fixed", "repeating"]:
    """How a (valid) cron expression behaves on daylight-saving days: see the module docstring.

    The Vixie/Debian cron rule, which cronsim applies: ``repeating`` when the
    minute or the hour field begins with ``*``, else ``fixed``.
    """
    minute, hour = cron.split()[:2]
    return "repeating" if minute.startswith("*") or hour.startswith("*") else "fixed"


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
