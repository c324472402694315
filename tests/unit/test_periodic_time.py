"""Periodic jobs without servers: occurrence times, DST days, leap days, catch-up, declarations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from postbox.errors import InvalidArgsError, InvalidOptionError, UnknownTaskError
from postbox.occurrences import Timing, dst_rule, due, next_after
from postbox.periodic import DuplicateScheduleError, ScheduleBook, periodic
from postbox.registry import Registry, task

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def run_clock(timing: Timing, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """What a leader ticking every ``step`` from ``start`` to ``end`` enqueues (the injected clock).

    The clock steps in UTC: stepping a zoned datetime would be wall-clock arithmetic, which
    jumps over a repeated hour.
    """
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    cursor = start
    fired: list[datetime] = []
    now = start
    while now <= end:
        decision = due(timing, cursor, now)
        fired += decision.enqueue
        cursor = decision.cursor
        assert decision.next_run > cursor
        now += step
    return fired


DST_DAYS = [
    # zone, the transition day, the UTC instant of the one run that day
    (BERLIN, datetime(2026, 3, 29), utc(2026, 3, 29, 1, 0)),  # 02:30 does not exist: runs at 03:00 CEST
    (BERLIN, datetime(2026, 10, 25), utc(2026, 10, 25, 0, 30)),  # 02:30 exists twice: runs at the first
    (NEW_YORK, datetime(2026, 3, 8), utc(2026, 3, 8, 7, 0)),  # 02:30 does not exist: runs at 03:00 EDT
    (NEW_YORK, datetime(2026, 11, 1), utc(2026, 11, 1, 7, 30)),  # 01:00-02:00 repeats; 02:30 EST once
]


@pytest.mark.parametrize(
    ("zone", "day", "expected"), DST_DAYS, ids=["berlin-spring", "berlin-fall", "ny-spring", "ny-fall"]
)
@pytest.mark.parametrize("step_minutes", [1, 7, 60])
def test_a_daily_0230_runs_exactly_once_on_both_dst_transition_days(
    zone: ZoneInfo, day: datetime, expected: datetime, step_minutes: int
) -> None:
    timing = Timing(cron="30 2 * * *", tz=zone.key)
    start = (day - timedelta(days=1)).replace(hour=0, tzinfo=zone)
    end = (day + timedelta(days=1)).replace(hour=12, tzinfo=zone)
    fired = run_clock(timing, start, end, timedelta(minutes=step_minutes))
    # the day before, the transition day, the day after: one run each, the middle one where cron says
    assert len(fired) == 3
    assert fired[1] == expected
    assert [f.astimezone(zone).date() for f in fired] == [(day + timedelta(days=d)).date() for d in (-1, 0, 1)]
    assert fired[0].astimezone(zone).strftime("%H:%M") == "02:30"
    assert fired[2].astimezone(zone).strftime("%H:%M") == "02:30"


def test_ticks_inside_the_repeated_hour_never_fire_the_second_0230() -> None:
    timing = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    # 02:15 CET is after 02:30 CEST: a cursor there must not give back the earlier wall time
    cursor = datetime(2026, 10, 25, 2, 15, fold=1, tzinfo=BERLIN)
    assert next_after(timing, cursor) == utc(2026, 10, 26, 1, 30)
    decision = due(timing, utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 45))
    assert decision.enqueue == []


# --- the daylight-saving rule: fixed-time expressions vs repeating ones ------------------------

BERLIN_SPRING, BERLIN_FALL = datetime(2026, 3, 29), datetime(2026, 10, 25)  # 02:00-03:00 skipped / repeated
NY_SPRING, NY_FALL = datetime(2026, 3, 8), datetime(2026, 11, 1)  # 02:00-03:00 skipped / 01:00-02:00 repeated


def night_of(cron: str, zone: ZoneInfo, day: datetime) -> list[str]:
    """The wall times (with their abbreviation) at which ``cron`` runs from 00:00 to 05:00 on ``day``.

    Computed four ways that must agree: a leader ticking every 1, 7 and 60
    minutes through the night, and one tick after the night with catch-up
    ``all`` (the backward walk through the occurrences).
    """
    timing = Timing(cron=cron, tz=zone.key, catch_up="all", max_catch_up=1000, grace=0)
    start = day.replace(hour=0, tzinfo=zone) - timedelta(minutes=1)
    end = day.replace(hour=5, tzinfo=zone)
    answers = []
    for step in (1, 7, 60):
        fired = run_clock(timing, start, end + timedelta(minutes=step), timedelta(minutes=step))
        answers.append([f for f in fired if f < end])
    answers.append([f for f in due(timing, start, end + timedelta(seconds=30)).enqueue if f < end])
    assert all(answer == answers[0] for answer in answers), answers
    return [f.astimezone(zone).strftime("%H:%M %Z") for f in answers[0]]


FIXED_TIME = [
    # spring forward: the wall times in the gap run once, at the first instant after it
    (BERLIN, BERLIN_SPRING, "30 2 * * *", ["03:00 CEST"]),
    (BERLIN, BERLIN_SPRING, "0-59/15 2 * * *", ["03:00 CEST"]),
    (BERLIN, BERLIN_SPRING, "0,30 1-3 * * *", ["01:00 CET", "01:30 CET", "03:00 CEST", "03:30 CEST"]),
    (NEW_YORK, NY_SPRING, "0,30 1-3 * * *", ["01:00 EST", "01:30 EST", "03:00 EDT", "03:30 EDT"]),
    # fall back: a wall time that exists twice runs once, at its first instance
    (BERLIN, BERLIN_FALL, "30 2 * * *", ["02:30 CEST"]),
    (BERLIN, BERLIN_FALL, "0-59/15 2 * * *", ["02:00 CEST", "02:15 CEST", "02:30 CEST", "02:45 CEST"]),
    (
        BERLIN,
        BERLIN_FALL,
        "0,30 1-3 * * *",
        ["01:00 CEST", "01:30 CEST", "02:00 CEST", "02:30 CEST", "03:00 CET", "03:30 CET"],
    ),
    (BERLIN, BERLIN_FALL, "0 0-23/2 * * *", ["00:00 CEST", "02:00 CEST", "04:00 CET"]),
    (NEW_YORK, NY_FALL, "30 1 * * *", ["01:30 EDT"]),
    (
        NEW_YORK,
        NY_FALL,
        "0,30 1-3 * * *",
        ["01:00 EDT", "01:30 EDT", "02:00 EST", "02:30 EST", "03:00 EST", "03:30 EST"],
    ),
]

REPEATING = [
    # spring forward: wall times inside the gap do not run
    (BERLIN, BERLIN_SPRING, "*/15 2 * * *", []),
    (BERLIN, BERLIN_SPRING, "*/30 1-3 * * *", ["01:00 CET", "01:30 CET", "03:00 CEST", "03:30 CEST"]),
    (BERLIN, BERLIN_SPRING, "0 * * * *", ["00:00 CET", "01:00 CET", "03:00 CEST", "04:00 CEST"]),
    (NEW_YORK, NY_SPRING, "*/15 2 * * *", []),
    (NEW_YORK, NY_SPRING, "*/30 1-3 * * *", ["01:00 EST", "01:30 EST", "03:00 EDT", "03:30 EDT"]),
    # fall back: wall times inside the repeated hour run at both instances
    (
        BERLIN,
        BERLIN_FALL,
        "*/15 2 * * *",
        ["02:00 CEST", "02:15 CEST", "02:30 CEST", "02:45 CEST", "02:00 CET", "02:15 CET", "02:30 CET", "02:45 CET"],
    ),
    (
        BERLIN,
        BERLIN_FALL,
        "*/30 1-3 * * *",
        ["01:00 CEST", "01:30 CEST", "02:00 CEST", "02:30 CEST", "02:00 CET", "02:30 CET", "03:00 CET", "03:30 CET"],
    ),
    (BERLIN, BERLIN_FALL, "0 */2 * * *", ["00:00 CEST", "02:00 CEST", "02:00 CET", "04:00 CET"]),
    (
        BERLIN,
        BERLIN_FALL,
        "0 * * * *",
        ["00:00 CEST", "01:00 CEST", "02:00 CEST", "02:00 CET", "03:00 CET", "04:00 CET"],
    ),
    (
        NEW_YORK,
        NY_FALL,
        "*/30 1-3 * * *",
        ["01:00 EDT", "01:30 EDT", "01:00 EST", "01:30 EST", "02:00 EST", "02:30 EST", "03:00 EST", "03:30 EST"],
    ),
    # New York repeats 01:00-02:00: its 2 o'clock hour exists once
    (NEW_YORK, NY_FALL, "*/15 2 * * *", ["02:00 EST", "02:15 EST", "02:30 EST", "02:45 EST"]),
]


def _case_id(case: tuple[ZoneInfo, datetime, str, list[str]]) -> str:
    zone, day, cron, _ = case
    return f"{zone.key.split('/')[-1]}-{day:%m-%d}-{cron.replace(' ', '_')}"


@pytest.mark.parametrize(("zone", "day", "cron", "expected"), FIXED_TIME, ids=[_case_id(c) for c in FIXED_TIME])
def test_a_fixed_time_expression_runs_each_wall_time_once_on_dst_days(
    zone: ZoneInfo, day: datetime, cron: str, expected: list[str]
) -> None:
    assert dst_rule(cron) == "fixed"
    assert night_of(cron, zone, day) == expected


@pytest.mark.parametrize(("zone", "day", "cron", "expected"), REPEATING, ids=[_case_id(c) for c in REPEATING])
def test_a_repeating_expression_follows_the_clock_on_dst_days(
    zone: ZoneInfo, day: datetime, cron: str, expected: list[str]
) -> None:
    assert dst_rule(cron) == "repeating"
    assert night_of(cron, zone, day) == expected


@pytest.mark.parametrize(
    ("repeating", "fixed"),
    [("*/15 2 * * *", "0-59/15 2 * * *"), ("*/30 1-3 * * *", "0,30 1-3 * * *"), ("0 */2 * * *", "0 0-23/2 * * *")],
)
def test_the_same_wall_times_written_two_ways_differ_only_across_a_transition(repeating: str, fixed: str) -> None:
    # an ordinary night: identical
    for zone in (BERLIN, NEW_YORK):
        assert night_of(repeating, zone, datetime(2026, 6, 14)) == night_of(fixed, zone, datetime(2026, 6, 14))
    # the fall-back night: the repeating one adds the second instances, in elapsed-time order
    fall_repeating, fall_fixed = night_of(repeating, BERLIN, BERLIN_FALL), night_of(fixed, BERLIN, BERLIN_FALL)
    assert set(fall_fixed) < set(fall_repeating)
    assert all(t.endswith("CET") and t[:5] < "03:00" for t in set(fall_repeating) - set(fall_fixed))


def test_every_minute_keeps_running_through_the_repeated_hour() -> None:
    # the rule chosen: "* * * * *" does not pause for the hour a wall-time-once rule would skip
    timing = Timing(cron="* * * * *", tz="Europe/Berlin", catch_up="all", max_catch_up=10_000)
    start = utc(2026, 10, 24, 23, 0)  # 01:00 CEST
    fired = run_clock(timing, start, start + timedelta(hours=3), timedelta(minutes=5))
    assert len(fired) == 180
    assert {b - a for a, b in pairwise(fired)} == {timedelta(minutes=1)}


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [(BERLIN, BERLIN_SPRING, 23), (BERLIN, BERLIN_FALL, 25), (NEW_YORK, NY_SPRING, 23), (NEW_YORK, NY_FALL, 25)],
)
def test_an_interval_counts_elapsed_seconds_whatever_the_zone_does(zone: ZoneInfo, day: datetime, hours: int) -> None:
    # `every` has no zone: a local day of 23 or 25 hours holds 23 or 25 hourly runs, all 3600 s apart
    start = day.replace(hour=0, tzinfo=zone)
    end = (day + timedelta(days=1)).replace(hour=0, tzinfo=zone)
    fired = run_clock(Timing(every=3600), start - timedelta(seconds=1), end, timedelta(minutes=13))
    fired = [f for f in fired if f >= start]
    assert len(fired) == hours
    assert {b - a for a, b in pairwise(fired)} == {timedelta(hours=1)}
    quarter = [f for f in run_clock(Timing(every=900), start, end, timedelta(minutes=10)) if f < end]
    assert len(quarter) == hours * 4 - 1  # (start, end): the start itself is not after the cursor


def test_leap_day_schedules() -> None:
    leap = Timing(cron="0 12 29 2 *", tz="Europe/Berlin")
    assert next_after(leap, utc(2026, 3, 1)) == utc(2028, 2, 29, 11, 0)
    assert next_after(leap, utc(2028, 2, 29, 11, 0)) == utc(2032, 2, 29, 11, 0)
    daily = Timing(cron="0 0 * * *", tz="UTC")
    fired = run_clock(daily, utc(2028, 2, 27, 12), utc(2028, 3, 2, 12), timedelta(hours=1))
    assert fired == [utc(2028, 2, 28), utc(2028, 2, 29), utc(2028, 3, 1), utc(2028, 3, 2)]


def test_an_interval_fires_on_a_grid_from_the_epoch_and_never_drifts() -> None:
    every = Timing(every=60)
    assert next_after(every, utc(2026, 1, 1, 0, 0, 30)) == utc(2026, 1, 1, 0, 1)
    assert next_after(every, utc(2026, 1, 1, 0, 1)) == utc(2026, 1, 1, 0, 2)  # strictly after
    fired = run_clock(every, utc(2026, 1, 1), utc(2026, 1, 1, 1, 0, 10), timedelta(seconds=7.3))
    assert fired == [utc(2026, 1, 1) + timedelta(minutes=m) for m in range(1, 61)]
    one = Timing(every=1, catch_up="all")
    decision = due(one, utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 5, 400_000))
    assert decision.enqueue == [utc(2026, 1, 1, 0, 0, s) for s in range(1, 6)]
    assert decision.cursor == utc(2026, 1, 1, 0, 0, 5)
    assert decision.next_run == utc(2026, 1, 1, 0, 0, 6)


# --- catch-up ------------------------------------------------------------------------------

# the relay was down from 00:00 to 05:00:30; an hourly schedule missed 01:00 .. 05:00
DOWN_FROM = utc(2026, 6, 1, 0, 0)
BACK_AT = utc(2026, 6, 1, 5, 0, 30)
HOURS = [utc(2026, 6, 1, h) for h in range(1, 6)]


def test_catch_up_latest_enqueues_only_the_most_recent_missed_occurrence() -> None:
    decision = due(Timing(cron="0 * * * *", catch_up="latest", grace=10), DOWN_FROM, BACK_AT)
    assert decision.enqueue == [HOURS[-1]]
    assert decision.skipped == 4
    assert decision.cursor == HOURS[-1]
    assert decision.next_run == utc(2026, 6, 1, 6)


def test_catch_up_all_enqueues_every_missed_occurrence_up_to_the_bound() -> None:
    assert due(Timing(cron="0 * * * *", catch_up="all", grace=10), DOWN_FROM, BACK_AT).enqueue == HOURS
    bounded = due(Timing(cron="0 * * * *", catch_up="all", max_catch_up=2, grace=10), DOWN_FROM, BACK_AT)
    assert bounded.enqueue == HOURS[-2:]
    assert bounded.skipped == 3


def test_catch_up_none_enqueues_no_missed_occurrence() -> None:
    decision = due(Timing(cron="0 * * * *", catch_up="none", grace=10), DOWN_FROM, BACK_AT)
    assert decision.enqueue == []
    assert decision.skipped == 5
    assert decision.cursor == HOURS[-1]  # never looked at again
    assert due(Timing(cron="0 * * * *", catch_up="none", grace=10), decision.cursor, BACK_AT).enqueue == []


def test_an_occurrence_within_the_grace_is_on_time_whatever_the_policy() -> None:
    # a 3-second failover of a 1-second interval: nothing is "missed"
    for policy in ("latest", "all", "none"):
        decision = due(Timing(every=1, catch_up=policy, grace=60), utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 3))
        assert decision.enqueue == [utc(2026, 1, 1, 0, 0, s) for s in (1, 2, 3)], policy
        assert decision.skipped == 0


def test_latest_skips_the_missed_ones_when_an_on_time_occurrence_follows() -> None:
    decision = due(Timing(every=60, catch_up="latest", grace=60), utc(2026, 1, 1), utc(2026, 1, 1, 1, 0, 5))
    assert decision.enqueue == [utc(2026, 1, 1, 1)]
    assert decision.skipped == 59


def test_nothing_due_moves_nothing() -> None:
    timing = Timing(cron="0 3 * * *", tz="Europe/Berlin")
    decision = due(timing, utc(2026, 6, 1, 1, 0), utc(2026, 6, 1, 12, 0))
    assert decision.enqueue == []
    assert decision.cursor == utc(2026, 6, 1, 1, 0)
    assert decision.next_run == utc(2026, 6, 2, 1, 0)


# --- declarations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({}, "cron"),
        ({"cron": "* * * * *", "every": 5}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "not cron"}, "cron"),
        ({"every": 0.5}, "every"),
        ({"every": float("nan")}, "every"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"cron": "* * * * *", "catch_up": "some"}, "catch_up"),
        ({"cron": "* * * * *", "max_catch_up": 0}, "max_catch_up"),
        ({"cron": "* * * * *", "grace": -1}, "grace"),
        # values that reached int(), float(), timedelta or the database before they were bounded
        ({"every": 10**5000}, "every"),  # OverflowError in math.isfinite; repr() itself fails
        ({"every": 10**20}, "every"),  # OverflowError in timedelta
        ({"every": 1e300}, "every"),
        ({"every": float("inf")}, "every"),
        ({"every": True}, "every"),
        ({"every": "60"}, "every"),
        ({"every": 366 * 86_400 + 1}, "every"),
        ({"cron": "* * * * *", "grace": 10**5000}, "grace"),
        ({"cron": "* * * * *", "grace": 1e300}, "grace"),
        ({"cron": "* * * * *", "grace": float("nan")}, "grace"),
        ({"cron": "* * * * *", "grace": True}, "grace"),
        ({"cron": "* * * * *", "grace": "60"}, "grace"),
        ({"cron": "* * * * *", "max_catch_up": 2**31}, "max_catch_up"),  # beyond the integer column
        ({"cron": "* * * * *", "max_catch_up": 10_001}, "max_catch_up"),
        ({"cron": "* * * * *", "max_catch_up": 10**5000}, "max_catch_up"),
        ({"cron": "* * * * *", "max_catch_up": 1.5}, "max_catch_up"),
        ({"cron": "* * * * *", "max_catch_up": True}, "max_catch_up"),
        ({"cron": "1" * 5000 + " * * * *"}, "cron"),  # a ValueError from int()'s digit limit in cronsim
        ({"cron": "* * * * * " + "0," * 600 + "0"}, "cron"),
        ({"cron": "* * * * * *"}, "cron"),  # a seconds field: cronsim would run it every second
        ({"cron": "@daily"}, "cron"),
        ({"cron": b"* * * * *"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"cron": "* * * * *", "tz": []}, "tz"),  # unhashable: a TypeError from the zone cache
        ({"cron": "* * * * *", "tz": 5}, "tz"),
        ({"cron": "* * * * *", "tz": "Europe/" + "x" * 5000}, "tz"),
    ],
)
def test_bad_timings_are_refused_with_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        Timing(**options)  # type: ignore[arg-type]
    assert info.value.field == field
    assert len(str(info.value)) < 200  # printable, and short whatever was passed


def test_the_bounds_themselves_are_accepted() -> None:
    longest = Timing(every=366 * 86_400, grace=366 * 86_400, max_catch_up=10_000)
    assert next_after(longest, utc(2026, 1, 1)) > utc(2026, 1, 1)
    assert due(longest, utc(2026, 1, 1), utc(2026, 6, 1)).enqueue == [utc(2026, 2, 12)]  # the epoch's grid
    listed = "0," + ",".join(str(m) for m in range(1, 60))
    assert next_after(Timing(cron=f"{listed} * * * *", grace=0), utc(2026, 1, 1)) == utc(2026, 1, 1, 0, 1)


def test_periodic_refuses_bad_timings_and_names_before_recording_anything() -> None:
    registry, book = Registry(), ScheduleBook()

    @task(registry=registry)
    def tick_task(ctx: object) -> None: ...

    for options, field in [
        ({"every": 10**5000}, "every"),
        ({"cron": "* * * * * *"}, "cron"),
        ({"every": 60, "grace": 1e300}, "grace"),
        ({"every": 60, "max_catch_up": 2**31}, "max_catch_up"),
        ({"every": 60, "name": 10**5000}, "name"),
    ]:
        with pytest.raises(InvalidOptionError) as info:
            periodic(tick_task, registry=registry, book=book, **options)  # type: ignore[arg-type]
        assert info.value.field == field
    assert len(book) == 0


def test_periodic_declares_schedules_of_a_registered_task() -> None:
    registry, book = Registry(), ScheduleBook()

    @task(queue="reports", priority=7, registry=registry)
    def report(ctx: object, region: str, full: bool = False) -> None: ...

    eu = periodic(
        report,
        cron="0 3 * * *",
        tz="Europe/Berlin",
        args={"region": "eu"},
        name="report-eu",
        registry=registry,
        book=book,
    )
    us = periodic(
        "report", every=3600, args={"region": "us"}, name="report-us", priority=2, registry=registry, book=book
    )
    assert (eu.task, eu.queue, eu.priority, eu.args, eu.expression) == (
        "report",
        "reports",
        7,
        {"region": "eu"},
        "0 3 * * *",
    )
    assert (us.priority, us.expression, us.timing.catch_up) == (2, "every 3600s", "latest")
    assert [s.name for s in book.all()] == ["report-eu", "report-us"]
    # the same declaration again (a module imported twice) is fine; another one under the name is not
    periodic(
        report,
        cron="0 3 * * *",
        tz="Europe/Berlin",
        args={"region": "eu"},
        name="report-eu",
        registry=registry,
        book=book,
    )
    with pytest.raises(DuplicateScheduleError):
        periodic(report, cron="0 4 * * *", args={"region": "eu"}, name="report-eu", registry=registry, book=book)
    with pytest.raises(InvalidArgsError):
        periodic(report, every=60, args={"region": 5}, name="bad-args", registry=registry, book=book)
    with pytest.raises(InvalidOptionError):
        periodic(report, every=60, args={"region": "x"}, name="no spaces", registry=registry, book=book)
    with pytest.raises(UnknownTaskError):
        periodic("nope", every=60, registry=registry, book=book)
    assert len(book) == 2
