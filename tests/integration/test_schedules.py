"""Periodic jobs on a real PostgreSQL: sync from code, the leader's tick, catch-up, operations.

The clock is injected (``now=``): nothing here waits for a real occurrence.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest
import redis.asyncio as aioredis

from postbox import schedule_store
from postbox.app.services import schedules as schedule_control
from postbox.app.services.audit import Actor
from postbox.app.services.errors import ConflictError, NotFoundError
from postbox.occurrences import Timing
from postbox.periodic import Schedule, ScheduleBook, periodic
from postbox.registry import Registry, task
from postbox.relay.scheduler import ScheduleDuty
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.relay import running_relay
from tests.harness.wait import wait_event, wait_until_async

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def sched(name: str, *, task_name: str = "noop", **timing: Any) -> Schedule:
    timing.setdefault("every", 60)
    return Schedule(name=name, task=task_name, timing=Timing(**timing), args={"n": name})


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[int, str, str, dict[str, Any], dict[str, Any]]]:
    conn.commit()
    rows = conn.execute("SELECT id, task, queue, args, headers FROM postbox.outbox ORDER BY id").fetchall()
    conn.commit()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def runs(conn: psycopg.Connection[Any], name: str | None = None) -> list[tuple[str, datetime, int, bool]]:
    conn.commit()
    rows = conn.execute(
        "SELECT schedule, occurrence, job_id, manual FROM postbox.schedule_runs"
        " WHERE %(n)s::text IS NULL OR schedule = %(n)s ORDER BY schedule, occurrence",
        {"n": name},
    ).fetchall()
    conn.commit()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


async def test_sync_inserts_updates_and_removes_only_what_the_process_owns(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await aconn.set_autocommit(True)
    first = await schedule_store.sync(aconn, [sched("a"), sched("b", task_name="other")], ["noop", "other"], now=T0)
    assert (first.inserted, first.updated, first.removed) == (["a", "b"], [], [])
    again = await schedule_store.sync(aconn, [sched("a"), sched("b", task_name="other")], ["noop", "other"], now=T0)
    assert (again.inserted, again.updated, again.removed) == ([], [], [])
    # a process that owns only `noop` and no longer declares `a`: `a` removed, `b` untouched
    partial = await schedule_store.sync(aconn, [], ["noop"], now=T0 + timedelta(minutes=1))
    assert (partial.inserted, partial.updated, partial.removed) == ([], [], ["a"])
    listed = {s.name: s for s in await schedule_control.list_schedules(aconn)}
    assert listed["a"].removed is True and listed["a"].next_run_at is None
    assert listed["b"].removed is False
    assert listed["b"].next_run_at == T0 + timedelta(minutes=1)
    assert listed["b"].expression == "every 60s"
    # declared again: back, from the sync's time on
    back = await schedule_store.sync(aconn, [sched("a")], ["noop"], now=T0 + timedelta(minutes=5, seconds=30))
    assert back.updated == ["a"]
    row = conn.execute("SELECT removed_at, cursor_at, next_run_at FROM postbox.schedules WHERE name = 'a'").fetchone()
    assert row == (None, T0 + timedelta(minutes=5, seconds=30), T0 + timedelta(minutes=6))


async def test_sync_takes_whole_and_fractional_intervals_side_by_side(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    """every=60 beside every=90.5 (and a cron one): the sync once sent them as a list psycopg refused."""
    await aconn.set_autocommit(True)
    declared = [sched("whole", every=60), sched("fraction", every=90.5), sched("cron", every=None, cron="0 3 * * *")]
    report = await schedule_store.sync(aconn, declared, ["noop"], now=T0)
    assert sorted(report.inserted) == ["cron", "fraction", "whole"]
    conn.commit()
    rows = conn.execute("SELECT name, every_seconds FROM postbox.schedules ORDER BY name").fetchall()
    assert [(name, None if every is None else float(every)) for name, every in rows] == [
        ("cron", None),
        ("fraction", 90.5),
        ("whole", 60.0),
    ]


async def test_each_occurrence_is_enqueued_once_with_its_bookkeeping(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await aconn.set_autocommit(True)
    await schedule_store.sync(aconn, [sched("every-minute", catch_up="all")], ["noop"], now=T0)
    nothing = await schedule_store.tick(aconn, now=T0 + timedelta(seconds=59))
    assert (nothing.looked_at, nothing.fired) == (0, [])
    report = await schedule_store.tick(aconn, now=T0 + timedelta(minutes=3, seconds=1))
    assert [f.occurrence for f in report.fired] == [T0 + timedelta(minutes=m) for m in (1, 2, 3)]
    assert [round(f.lateness) for f in report.fired] == [121, 61, 1]
    # the same clock again (a second leader with a stale view): nothing more
    assert (await schedule_store.tick(aconn, now=T0 + timedelta(minutes=3, seconds=1))).fired == []
    found = jobs(conn)
    assert [j[1:4] for j in found] == [("noop", "default", {"n": "every-minute"})] * 3
    assert [j[4]["schedule"] for j in found] == ["every-minute"] * 3
    assert [r[1] for r in runs(conn)] == [T0 + timedelta(minutes=m) for m in (1, 2, 3)]
    assert [r[2] for r in runs(conn)] == [j[0] for j in found]
    listed = await schedule_control.get_schedule(aconn, "every-minute")
    assert listed.last_run_at == T0 + timedelta(minutes=3)
    assert listed.last_job_id == found[-1][0]
    assert listed.last_job_state == "pending"
    assert listed.next_run_at == T0 + timedelta(minutes=4)


async def test_two_leaders_ticking_at_once_enqueue_each_occurrence_once(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    names = [f"s{i}" for i in range(50)]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as a:
        await schedule_store.sync(a, [sched(n, every=1, catch_up="all") for n in names], ["noop"], now=T0)
    conns = [await psycopg.AsyncConnection.connect(database_url, autocommit=True) for _ in range(2)]
    try:
        for second in range(1, 6):
            at = T0 + timedelta(seconds=second)
            await asyncio.gather(*(schedule_store.tick(c, now=at, limit=7) for c in conns))
            # SKIP LOCKED leaves some rows to the other; drain what is left
            while (await schedule_store.tick(conns[0], now=at, limit=7)).looked_at:
                pass
    finally:
        for c in conns:
            await c.close()
    found = runs(conn)
    assert len(found) == len(names) * 5
    assert len({(r[0], r[1]) for r in found}) == len(found)
    assert {r[1] for r in found} == {T0 + timedelta(seconds=s) for s in range(1, 6)}
    assert len(jobs(conn)) == len(found)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("latest", [5]), ("all", [1, 2, 3, 4, 5]), ("none", [])],
)
async def test_catch_up_after_no_relay_ran_for_five_hours(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any], policy: str, expected: list[int]
) -> None:
    await aconn.set_autocommit(True)
    hourly = Schedule(name="hourly", task="noop", timing=Timing(cron="0 * * * *", catch_up=policy, grace=10))  # type: ignore[arg-type]
    await schedule_store.sync(aconn, [hourly], ["noop"], now=T0)
    report = await schedule_store.tick(aconn, now=T0 + timedelta(hours=5, seconds=30))
    assert [f.occurrence for f in report.fired] == [T0 + timedelta(hours=h) for h in expected]
    assert report.skipped == 5 - len(expected)
    # then on time again
    later = await schedule_store.tick(aconn, now=T0 + timedelta(hours=6, seconds=1))
    assert [f.occurrence for f in later.fired] == [T0 + timedelta(hours=6)]


async def test_dst_day_through_the_database_with_the_injected_clock(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await aconn.set_autocommit(True)
    start = datetime(2026, 10, 24, 0, 0, tzinfo=UTC)
    nightly = Schedule(name="nightly", task="noop", timing=Timing(cron="30 2 * * *", tz="Europe/Berlin"))
    await schedule_store.sync(aconn, [nightly], ["noop"], now=start)
    now = start
    while now < start + timedelta(days=3):
        await schedule_store.tick(aconn, now=now)
        now += timedelta(minutes=10)
    assert [r[1] for r in runs(conn)] == [
        datetime(2026, 10, 24, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first of the two 02:30s
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET
    ]


async def test_a_removed_schedule_stops_and_a_changed_expression_makes_no_duplicate(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await aconn.set_autocommit(True)
    await schedule_store.sync(aconn, [sched("gone", every=10), sched("changes", every=20)], ["noop"], now=T0)
    await schedule_store.tick(aconn, now=T0 + timedelta(seconds=20))
    assert [r[1] for r in runs(conn, "changes")] == [T0 + timedelta(seconds=20)]
    # new code at T0+20s: `gone` is no longer declared, `changes` fires every 10 s (20 s is on both grids)
    await schedule_store.sync(aconn, [sched("changes", every=10)], ["noop"], now=T0 + timedelta(seconds=20))
    for second in (25, 30, 40, 60):
        await schedule_store.tick(aconn, now=T0 + timedelta(seconds=second))
    assert [r[1] for r in runs(conn, "gone")] == [T0 + timedelta(seconds=s) for s in (10, 20)]
    assert [r[1] for r in runs(conn, "changes")] == [T0 + timedelta(seconds=s) for s in (20, 30, 40, 50, 60)]


async def test_pause_resume_and_trigger_are_audited(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any], redis_url: str, redis_prefix: str
) -> None:
    await aconn.set_autocommit(True)
    await schedule_store.sync(aconn, [sched("ops", every=60)], ["noop"], now=T0)
    actor = Actor("test:ops", request_id="r-1")
    paused = await schedule_control.set_paused(aconn, "ops", True, actor)
    assert paused.paused is True
    assert (await schedule_store.tick(aconn, now=T0 + timedelta(minutes=5))).fired == []
    resumed = await schedule_control.set_paused(aconn, "ops", False, actor)
    assert resumed.paused is False
    # occurrences that fell while paused are skipped (the cursor moved to the resume)
    assert (await schedule_store.tick(aconn)).fired == []
    client = aioredis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.subscribe(events_channel(redis_prefix))
    try:
        await pubsub.get_message(timeout=1.0)  # the subscribe confirmation
        fired = await schedule_control.trigger(aconn, "ops", actor, redis=client, prefix=redis_prefix)
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
    finally:
        await pubsub.aclose()
        await client.aclose()
    assert message is not None
    assert orjson.loads(message["data"])["job_id"] == fired.job_id
    assert runs(conn, "ops") == [("ops", fired.occurrence, fired.job_id, True)]
    assert (await schedule_control.get_schedule(aconn, "ops")).last_job_id == fired.job_id
    conn.commit()
    audit = conn.execute("SELECT actor, action, target, request_id FROM postbox.audit_log ORDER BY id").fetchall()
    assert audit == [
        ("test:ops", "schedule.pause", "schedule:ops", "r-1"),
        ("test:ops", "schedule.resume", "schedule:ops", "r-1"),
        ("test:ops", "schedule.trigger", "schedule:ops", "r-1"),
    ]
    with pytest.raises(NotFoundError):
        await schedule_control.trigger(aconn, "nope", actor)
    await schedule_store.sync(aconn, [], ["noop"], now=T0)
    with pytest.raises(ConflictError):
        await schedule_control.trigger(aconn, "ops", actor)
    assert len(runs(conn, "ops")) == 1


async def test_the_duty_sleeps_until_the_next_due_time_and_counts_what_it_enqueues(
    aconn: psycopg.AsyncConnection[Any],
    conn: psycopg.Connection[Any],
    database_url: str,
    redis_url: str,
    redis_prefix: str,
) -> None:
    await aconn.set_autocommit(True)
    registry, book = Registry(), ScheduleBook()

    @task(registry=registry, queue="reports")
    def report(ctx: object, region: str) -> None: ...

    periodic(report, every=3600, args={"region": "eu"}, name="hourly-eu", registry=registry, book=book)
    await schedule_store.sync(aconn, book.all(), registry.names(), now=T0)
    clock = [T0 + timedelta(minutes=59)]
    mono = [100.0]
    client = aioredis.Redis.from_url(redis_url)
    duty = ScheduleDuty(redis=client, prefix=redis_prefix, clock=lambda: clock[0], monotonic=lambda: mono[0], refresh=5)
    try:
        assert await duty.step(aconn) == 0
        assert duty.wait_hint() == 5.0  # due in 60 s: the refresh bound first
        closed = await psycopg.AsyncConnection.connect(database_url)
        await closed.close()
        assert await duty.step(closed) == 0  # not yet time to look: not a single query
        mono[0] += 5
        clock[0] = T0 + timedelta(minutes=59, seconds=58)
        await duty.step(aconn)
        assert duty.wait_hint() == pytest.approx(2.0)
        mono[0] += 2
        clock[0] = T0 + timedelta(hours=1, seconds=0.25)
        pubsub = client.pubsub()
        await pubsub.subscribe(events_channel(redis_prefix))
        await pubsub.get_message(timeout=1.0)  # the subscribe confirmation
        assert await duty.step(aconn) == 1
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
        await pubsub.aclose()
    finally:
        await client.aclose()
    assert message is not None
    evt = orjson.loads(message["data"])
    assert (evt["type"], evt["schedule"], evt["occurrence"], evt["queue"], evt["task"]) == (
        "enqueued",
        "hourly-eu",
        "2026-06-01T13:00:00+00:00",
        "reports",
        "report",
    )
    assert duty.metrics.enqueued.labels("reports", "report")._value.get() == 1
    assert duty.metrics.lateness._sum.get() == pytest.approx(0.25)
    assert [j[1:4] for j in jobs(conn)] == [("report", "reports", {"region": "eu"})]


async def test_the_leading_relay_runs_the_duty_and_exposes_its_metrics(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any], settings: Settings
) -> None:
    await aconn.set_autocommit(True)
    await schedule_store.sync(aconn, [sched("each-second", every=1)], ["noop"])
    async with running_relay(settings) as (relay, signals):
        await wait_event(signals.leader, 10)
        registry = relay.metrics.registry

        def counted() -> float:
            value = registry.get_sample_value(
                "postbox_schedule_occurrences_total", {"queue": "default", "task": "noop"}
            )
            return value or 0.0

        # The duty counts a tick's occurrences after its commit: wait on the counter, not the rows.
        await wait_until_async(lambda: counted() >= 2, 10, message="two occurrences counted")
        enqueued = counted()
        lateness = registry.get_sample_value("postbox_schedule_lateness_seconds_count")
        stored = len(runs(conn, "each-second"))
    assert enqueued >= 2
    assert lateness == enqueued
    assert stored >= enqueued


@pytest.mark.parametrize(
    "broken",
    [
        "cron = '0 * * * *', every_seconds = NULL, tz = 'Mars/Olympus'",
        "every_seconds = 1e300",  # was an OverflowError in timedelta that ended every tick
        "grace_seconds = 1e300",
        "cron = '* * * * * *', every_seconds = NULL",  # a seconds field
    ],
    ids=["zone", "every", "grace", "six-fields"],
)
async def test_a_stored_schedule_that_cannot_be_evaluated_does_not_stop_the_others(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any], broken: str
) -> None:
    await aconn.set_autocommit(True)
    await schedule_store.sync(aconn, [sched("fine", every=60), sched("broken", every=60)], ["noop"], now=T0)
    conn.execute(f"UPDATE postbox.schedules SET {broken} WHERE name = 'broken'")  # edited by hand
    conn.commit()
    report = await schedule_store.tick(aconn, now=T0 + timedelta(minutes=1))
    assert [f.schedule for f in report.fired] == ["fine"]
    row = conn.execute("SELECT cursor_at, next_run_at FROM postbox.schedules WHERE name = 'broken'").fetchone()
    conn.commit()
    assert row == (T0, T0 + timedelta(minutes=2))  # looked at again a minute later, nothing skipped


async def test_a_process_starts_even_when_its_schedules_cannot_be_synchronised(empty_database_url: str) -> None:
    registry, book = Registry(), ScheduleBook()

    @task(registry=registry)
    def job(ctx: object) -> None: ...

    periodic(job, every=60, registry=registry, book=book)
    # unreachable database, then a database without postbox's tables: logged, not raised
    assert await schedule_store.sync_at_start("postgresql://postgres@127.0.0.1:1/none", book, registry) is None
    assert await schedule_store.sync_at_start(empty_database_url, book, registry) is None


async def test_a_leader_that_dies_before_its_tick_commits_leaves_nothing_and_the_next_one_enqueues_once(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as setup:
        await schedule_store.sync(setup, [sched("s", every=1, catch_up="all")], ["noop"], now=T0)
    at = T0 + timedelta(seconds=3)
    dying = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    seen: list[int] = []

    async def killed(report: schedule_store.TickReport) -> None:
        seen.extend(f.job_id for f in report.fired)  # everything written, not committed
        conn.execute("SELECT pg_terminate_backend(%s)", (dying.info.backend_pid,))
        conn.commit()

    with pytest.raises(psycopg.OperationalError):
        await schedule_store.tick(dying, now=at, before_commit=killed)
    await dying.close()
    assert len(seen) == 3
    assert runs(conn) == [] and jobs(conn) == []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        first = await schedule_store.tick(leader, now=at)
        again = await schedule_store.tick(leader, now=at)  # a leader after a committed tick: nothing
    assert [f.occurrence for f in first.fired] == [T0 + timedelta(seconds=s) for s in (1, 2, 3)]
    assert again.fired == []
    assert [r[1] for r in runs(conn)] == [T0 + timedelta(seconds=s) for s in (1, 2, 3)]
    assert len(jobs(conn)) == 3


async def test_a_leader_frozen_inside_its_tick_loses_its_session_after_the_timeout(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as setup:
        await schedule_store.sync(setup, [sched("s", every=1)], ["noop"], now=T0)
    frozen = await psycopg.AsyncConnection.connect(database_url, autocommit=True)

    async def freeze(report: schedule_store.TickReport) -> None:
        # idle in the transaction, holding the schedule's row lock, past the timeout
        def ended() -> bool:
            conn.commit()
            alive = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (frozen.info.backend_pid,)
            ).fetchone()
            conn.commit()
            return alive == (0,)

        await wait_until_async(ended, 30, message="the frozen tick's session ended by its idle-in-transaction timeout")

    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        await schedule_store.tick(frozen, now=T0 + timedelta(seconds=1), timeout_ms=300, before_commit=freeze)
    await frozen.close()
    assert runs(conn) == []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        report = await schedule_store.tick(leader, now=T0 + timedelta(seconds=1))
    assert [f.occurrence for f in report.fired] == [T0 + timedelta(seconds=1)]


async def test_a_trigger_at_the_instant_of_an_existing_run_is_refused_not_half_done(
    aconn: psycopg.AsyncConnection[Any], conn: psycopg.Connection[Any]
) -> None:
    await aconn.set_autocommit(True)
    await schedule_store.sync(aconn, [sched("twice", every=60)], ["noop"], now=T0)
    actor = Actor("test:ops")
    async with aconn.transaction():  # one transaction: both triggers see the same now()
        first = await schedule_control.trigger(aconn, "twice", actor)
        with pytest.raises(ConflictError):
            await schedule_control.trigger(aconn, "twice", actor)
    assert [r[2] for r in runs(conn, "twice")] == [first.job_id]
    assert [j[0] for j in jobs(conn)] == [first.job_id]
    assert (await schedule_control.get_schedule(aconn, "twice")).last_job_id == first.job_id


async def test_a_tick_that_raises_a_bug_is_logged_and_retried_later_never_raised(
    aconn: psycopg.AsyncConnection[Any],
    database_url: str,
    redis_url: str,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A non-database error while evaluating schedules must not end the relay (nor every next leader)."""
    await aconn.set_autocommit(True)

    async def broken_tick(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unreachable")

    mono = [500.0]
    client = aioredis.Redis.from_url(redis_url)
    duty = ScheduleDuty(redis=client, prefix=redis_prefix, monotonic=lambda: mono[0], refresh=5)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(schedule_store, "tick", broken_tick)
            assert await duty.step(aconn) == 0
        assert duty.wait_hint() == 60.0  # looked at again after FAILED_TICK_RETRY, not spun on
        assert "periodic jobs: a tick failed" in caplog.text
        # A database error still reaches the relay's session loop, which owns the session.
        mono[0] += 61
        closed = await psycopg.AsyncConnection.connect(database_url)
        await closed.close()
        with pytest.raises(psycopg.OperationalError):
            await duty.step(closed)
    finally:
        await client.aclose()
