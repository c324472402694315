"""Retention (jobs.retention, ``postbox prune``) on a real PostgreSQL.

The clock is pinned: rows get explicit timestamps around NOW and prune gets
``now=NOW``, so nothing sleeps and nothing depends on the wall clock.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from postbox import retention
from postbox.app import prune_cli
from postbox.settings import Settings

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=8)  # past the 7-day retention
YOUNG = NOW - timedelta(days=6)


def insert_job(
    conn: psycopg.Connection[Any],
    state: str,
    finished_at: datetime | None,
    *,
    attempts: int = 1,
    result: dict[str, Any] | None = None,
    result_expires_at: datetime | None = None,
    discarded_at: datetime | None = None,
) -> int:
    row = conn.execute(
        """
        INSERT INTO postbox.outbox (queue, task, state, attempts, created_at, finished_at, result, result_expires_at,
                            discarded_at, published_at)
        VALUES ('default', 'noop', %s, %s, %s, %s, %s, %s, %s, %s)
        RETURNING id
        """,
        (
            state,
            attempts,
            (finished_at or NOW) - timedelta(minutes=5),
            finished_at,
            Jsonb(result) if result is not None else None,
            result_expires_at,
            discarded_at,
            None if state == "pending" else OLD,
        ),
    ).fetchone()
    assert row is not None
    job_id = int(row[0])
    for attempt in range(1, attempts + 1):
        conn.execute(
            "INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, started_at, outcome)"
            " VALUES (%s, %s, 'w', %s, %s)",
            (job_id, attempt, finished_at or NOW, state),
        )
    return job_id


def insert_marker(conn: psycopg.Connection[Any], outbox_id: int, processed_at: datetime) -> None:
    conn.execute(
        "INSERT INTO postbox.processed_jobs (outbox_id, processed_at) VALUES (%s, %s)", (outbox_id, processed_at)
    )


def ids(conn: psycopg.Connection[Any], query: Any) -> set[int]:
    found = {int(r[0]) for r in conn.execute(query).fetchall()}
    conn.commit()  # prune wants a connection outside any transaction
    return found


@pytest.fixture
def world(conn: psycopg.Connection[Any]) -> dict[str, set[int]]:
    """33 finished jobs past retention, and everything that must survive."""
    old_finished = {insert_job(conn, "succeeded", OLD - timedelta(seconds=i)) for i in range(25)}
    old_finished |= {insert_job(conn, "cancelled", OLD, attempts=0) for _ in range(5)}
    old_finished |= {insert_job(conn, "expired", OLD - timedelta(days=30), attempts=0) for _ in range(3)}
    kept = {insert_job(conn, "succeeded", YOUNG) for _ in range(4)}
    # dead letters are kept however old, discarded or not: only `dlq purge` removes them
    dead = {insert_job(conn, "dead", OLD - timedelta(days=60), attempts=5) for _ in range(2)}
    dead.add(insert_job(conn, "dead", OLD - timedelta(days=60), attempts=5, discarded_at=OLD - timedelta(days=59)))
    unfinished = {insert_job(conn, state, None) for state in ("pending", "queued", "running", "retrying")}
    kept |= dead | unfinished

    # processed_jobs markers
    old_markers_deleted = set(list(old_finished)[:6])
    for job_id in old_markers_deleted:
        insert_marker(conn, job_id, OLD)
    gone_job = 10_000_000  # its outbox row was purged long ago
    insert_marker(conn, gone_job, OLD)
    old_markers_deleted.add(gone_job)
    markers_kept = set()
    for job_id in [*sorted(dead)[:1], *sorted(unfinished)[:2]]:  # job not finished for good: keep
        insert_marker(conn, job_id, OLD)
        markers_kept.add(job_id)
    young_marker_job = sorted(kept - dead - unfinished)[0]
    insert_marker(conn, young_marker_job, YOUNG)
    markers_kept.add(young_marker_job)
    conn.commit()
    return {
        "old_finished": old_finished,
        "kept": kept,
        "dead": dead,
        "markers_deleted": old_markers_deleted,
        "markers_kept": markers_kept,
    }


def small_batches(settings: Settings, size: int = 10) -> Settings:
    return settings.model_copy(update={"prune_batch_size": size})


def test_prune_removes_exactly_the_rows_past_retention_in_batches(
    conn: psycopg.Connection[Any], settings: Settings, world: dict[str, set[int]]
) -> None:
    seen: list[tuple[str, int]] = []
    report = retention.prune(conn, small_batches(settings), now=NOW, on_batch=lambda k, n: seen.append((k, n)))

    assert report.finished == 33
    assert report.processed == 7
    assert report.results == 0
    assert report.complete is True
    # 33 rows in batches of 10, then the 7 markers in one batch
    assert report.batches == [("finished", 10), ("finished", 10), ("finished", 10), ("finished", 3), ("processed", 7)]
    assert seen == report.batches

    remaining = ids(conn, "SELECT id FROM postbox.outbox")
    assert remaining == world["kept"]
    assert not remaining & world["old_finished"]
    assert ids(conn, "SELECT id FROM postbox.outbox WHERE state = 'dead'") == world["dead"]
    # attempts went with their jobs (same statement); the kept ones' history is intact
    assert ids(conn, "SELECT DISTINCT outbox_id FROM postbox.job_attempts") == ids(
        conn, "SELECT id FROM postbox.outbox WHERE attempts > 0"
    )
    assert conn.execute("SELECT count(*) FROM postbox.job_attempts").fetchone() == (4 + 3 * 5 + 4,)
    conn.commit()
    assert ids(conn, "SELECT outbox_id FROM postbox.processed_jobs") == world["markers_kept"]

    again = retention.prune(conn, small_batches(settings), now=NOW)
    assert (again.total, again.batches) == (0, [])


def test_dry_run_counts_and_changes_nothing(
    conn: psycopg.Connection[Any], settings: Settings, world: dict[str, set[int]]
) -> None:
    before = conn.execute(
        "SELECT (SELECT count(*) FROM postbox.outbox), (SELECT count(*) FROM postbox.processed_jobs)"
    ).fetchone()
    conn.commit()
    report = retention.prune(conn, small_batches(settings), now=NOW, dry_run=True)
    assert (report.finished, report.processed, report.results, report.batches) == (33, 7, 0, [])
    after = conn.execute(
        "SELECT (SELECT count(*) FROM postbox.outbox), (SELECT count(*) FROM postbox.processed_jobs)"
    ).fetchone()
    assert after == before == (33 + len(world["kept"]), 11)


def test_max_batches_bounds_one_call(
    conn: psycopg.Connection[Any], settings: Settings, world: dict[str, set[int]]
) -> None:
    first = retention.prune(conn, small_batches(settings), now=NOW, max_batches=2)
    assert first.batches == [("finished", 10), ("finished", 10)]
    assert first.complete is False
    rest = retention.prune(conn, small_batches(settings), now=NOW)
    assert rest.batches == [("finished", 10), ("finished", 3), ("processed", 7)]
    assert ids(conn, "SELECT id FROM postbox.outbox") == world["kept"]


def test_expired_results_are_cleared_on_kept_rows(conn: psycopg.Connection[Any], settings: Settings) -> None:
    expired = insert_job(conn, "succeeded", YOUNG, result={"n": 1}, result_expires_at=NOW - timedelta(seconds=1))
    fresh = insert_job(conn, "succeeded", YOUNG, result={"n": 2}, result_expires_at=NOW + timedelta(hours=1))
    conn.commit()
    report = retention.prune(conn, settings, now=NOW)
    assert (report.finished, report.results, report.batches) == (0, 1, [("results", 1)])
    rows = dict(conn.execute("SELECT id, result FROM postbox.outbox").fetchall())
    assert rows == {expired: None, fresh: {"n": 2}}


def test_a_locked_row_is_skipped_and_nothing_waits(
    conn: psycopg.Connection[Any], database_url: str, settings: Settings
) -> None:
    old = [insert_job(conn, "succeeded", OLD) for _ in range(3)]
    conn.commit()
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as producer:
        holder.execute("SELECT 1 FROM postbox.outbox WHERE id = %s FOR UPDATE", (old[0],))
        # a producer transaction in flight: inserting, not yet committed
        producer.execute("INSERT INTO postbox.outbox (queue, task) VALUES ('default', 'noop')")
        conn.execute("SET lock_timeout = '2s'")  # a wait would fail the test instead of hanging
        conn.commit()
        report = retention.prune(conn, settings, now=NOW)
        assert report.batches == [("finished", 2)]
        assert ids(conn, "SELECT id FROM postbox.outbox WHERE state = 'succeeded'") == {old[0]}
        producer.commit()
        holder.rollback()
    report = retention.prune(conn, settings, now=NOW)
    assert report.batches == [("finished", 1)]
    assert ids(conn, "SELECT id FROM postbox.outbox WHERE state = 'succeeded'") == set()
    assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'pending'").fetchone() == (1,)


def test_prune_refuses_a_connection_inside_a_transaction(conn: psycopg.Connection[Any], settings: Settings) -> None:
    conn.execute("SELECT 1")
    with pytest.raises(ValueError, match="outside any transaction"):
        retention.prune(conn, settings, now=NOW)


async def test_prune_async_matches(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any], settings: Settings, world: dict[str, set[int]]
) -> None:
    report = await retention.prune_async(aconn, small_batches(settings, 20), now=NOW)
    assert report.batches == [("finished", 20), ("finished", 13), ("processed", 7)]
    assert ids(conn, "SELECT id FROM postbox.outbox") == world["kept"]


def test_cli_prunes_with_the_database_clock(
    conn: psycopg.Connection[Any],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    insert = (
        "INSERT INTO postbox.outbox (queue, task, state, finished_at)"
        " VALUES ('default', 'noop', 'succeeded', now() - make_interval(days => %s)) RETURNING id"
    )
    stale = conn.execute(insert, (8,)).fetchone()
    recent = conn.execute(insert, (6,)).fetchone()
    conn.commit()
    assert stale is not None and recent is not None
    monkeypatch.setenv("POSTBOX_DATABASE_URL", database_url)
    monkeypatch.delenv("DATABASE_URL", raising=False)

    assert prune_cli.main(["--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] == 1
    assert ids(conn, "SELECT id FROM postbox.outbox") == {stale[0], recent[0]}

    assert prune_cli.main([]) == 0
    assert "removed 1 finished jobs" in capsys.readouterr().out
    assert ids(conn, "SELECT id FROM postbox.outbox") == {recent[0]}

    monkeypatch.setenv("POSTBOX_PRUNE_BATCH_SIZE", "0")
    assert prune_cli.main([]) == 2
    assert "POSTBOX_PRUNE_BATCH_SIZE" in capsys.readouterr().err


async def test_prune_duty_runs_a_round_per_interval(
    conn: psycopg.Connection[Any], database_url: str, settings: Settings
) -> None:
    insert = (
        "INSERT INTO postbox.outbox (queue, task, state, finished_at)"
        " SELECT 'default', 'noop', 'succeeded', now() - make_interval(days => 8) FROM generate_series(1, %s)"
    )
    conn.execute(insert, (5,))
    conn.commit()
    clock = [1000.0]
    reports: list[retention.PruneReport] = []
    duty = retention.PruneDuty(
        settings.model_copy(update={"prune_interval": 60.0, "prune_batch_size": 2}),
        database_url,
        max_batches=2,
        clock=lambda: clock[0],
        on_report=reports.append,
    )
    try:
        assert duty.kick() is True  # the first kick runs at once
        assert duty.kick() is False  # a round is running / not due
        assert duty.task is not None
        first = await duty.task
        assert first.batches == [("finished", 2), ("finished", 2)] and first.complete is False

        clock[0] += 59.0
        assert duty.kick() is False  # not due yet
        clock[0] += 1.0
        assert duty.kick() is True
        second = await duty.task
        assert second.batches == [("finished", 1)] and second.complete is True
        assert reports == [first, second]
        assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)
    finally:
        await duty.stop()


async def test_prune_duty_is_off_at_interval_zero(database_url: str, settings: Settings) -> None:
    duty = retention.PruneDuty(settings.model_copy(update={"prune_interval": 0.0}), database_url)
    assert duty.kick() is False
    assert duty.task is None
