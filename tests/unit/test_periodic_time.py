"""Periodic jobs without servers: occurrence times, DST days, leap days, catch-up, declarations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from postbox.errors import InvalidArgsError, InvalidOptionError, UnknownTaskError
from postbox.occurrences import Timing, due, next_after
from postbox.periodic import DuplicateScheduleError, ScheduleBook, periodic
from postbox.registry import Registry, task

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def run_clock(timing: Timing, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """What a leader ticking every ``step`` from ``start`` to ``end`` enqueues (the injected clock)."""
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
    ],
)
def test_bad_timings_are_refused_with_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        Timing(**options)  # type: ignore[arg-type]
    assert info.value.field == field


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
