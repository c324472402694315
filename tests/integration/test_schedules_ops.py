"""Operating periodic jobs: ``/api/v1/schedules`` and ``postbox schedules`` on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from postbox import schedule_store
from postbox.app.admin import schedules_cli
from postbox.occurrences import Timing
from postbox.periodic import Schedule
from postbox.settings import Settings
from tests.harness.api import API_KEY, audit_rows, make_client

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def seed(database_url: str) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await schedule_store.sync(
                conn,
                [
                    Schedule("nightly", "noop", Timing(cron="30 2 * * *", tz="Europe/Berlin"), {}),
                    Schedule("often", "noop", Timing(every=60), {"secret": "x"}, queue="mail", priority=7),
                ],
                ["noop"],
                now=T0,
            )
            await schedule_store.tick(conn, now=datetime(2026, 6, 2, 0, 30, 5, tzinfo=UTC), limit=10)

    asyncio.run(go())


def test_list_pause_resume_trigger_over_rest_behind_the_key(
    settings: Settings, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    seed(database_url)
    with make_client(settings, api_key=API_KEY) as client:
        listed = client.get("/api/v1/schedules")
        assert listed.status_code == 200
        by_name = {s["name"]: s for s in listed.json()}
        assert sorted(by_name) == ["nightly", "often"]
        nightly = by_name["nightly"]
        assert (nightly["task"], nightly["expression"], nightly["tz"], nightly["paused"]) == (
            "noop",
            "30 2 * * *",
            "Europe/Berlin",
            False,
        )
        assert nightly["last_run_at"] == "2026-06-02T00:30:00Z"
        assert nightly["next_run_at"] == "2026-06-03T00:30:00Z"
        assert nightly["last_job_state"] == "pending"
        assert isinstance(nightly["last_job_id"], int)
        assert "args" not in nightly
        assert by_name["often"]["expression"] == "every 60s"
        # destructive without the key: refused, nothing written
        assert client.post("/api/v1/schedules/often/pause").status_code == 401
        assert client.post("/api/v1/schedules/often/trigger").status_code == 401
        assert audit_rows(conn) == []
        key = {"X-API-Key": API_KEY}
        paused = client.post("/api/v1/schedules/often/pause", headers=key)
        assert (paused.status_code, paused.json()["paused"]) == (200, True)
        resumed = client.post("/api/v1/schedules/often/resume", headers=key)
        assert (resumed.status_code, resumed.json()["paused"]) == (200, False)
        fired = client.post("/api/v1/schedules/often/trigger", headers=key)
        assert fired.status_code == 201
        job_id = fired.json()["job_id"]
        got = client.get(f"/api/v1/jobs/{job_id}", headers=key).json()
        assert (got["task"], got["queue"], got["priority"]) == ("noop", "mail", 7)
        missing = client.post("/api/v1/schedules/nope/trigger", headers=key)
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
        assert client.get("/api/v1/schedules/nope").status_code == 404
        assert client.get("/api/v1/schedules/bad%20name").status_code == 422
    assert [row[:3] for row in audit_rows(conn)] == [
        ("api:key", "schedule.pause", "schedule:often"),
        ("api:key", "schedule.resume", "schedule:often"),
        ("api:key", "schedule.trigger", "schedule:often"),
    ]


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)


@pytest.mark.usefixtures("cli_env")
def test_postbox_schedules_list_pause_resume_trigger(
    database_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    seed(database_url)
    assert schedules_cli.main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "NAME",
        "TASK",
        "EXPRESSION",
        "TZ",
        "CATCH_UP",
        "PAUSED",
        "REMOVED",
        "NEXT_RUN_AT",
        "LAST_RUN_AT",
        "LAST_JOB_ID",
        "LAST_JOB_STATE",
    ]
    assert [line.split()[0] for line in out[1:]] == ["nightly", "often"]
    assert schedules_cli.main(["pause", "often"]) == 0
    assert capsys.readouterr().out == "schedule often paused\n"
    assert schedules_cli.main(["list", "--json"]) == 0
    listed = {s["name"]: s for s in orjson.loads(capsys.readouterr().out)}
    assert listed["often"]["paused"] is True
    assert schedules_cli.main(["resume", "often"]) == 0
    assert capsys.readouterr().out == "schedule often resumed\n"
    assert schedules_cli.main(["trigger", "often", "--json"]) == 0
    fired = orjson.loads(capsys.readouterr().out)
    row = conn.execute("SELECT task, queue, args FROM postbox.outbox WHERE id = %s", (fired["job_id"],)).fetchone()
    conn.commit()
    assert row == ("noop", "mail", {"secret": "x"})
    assert schedules_cli.main(["trigger", "nope"]) == 1
    assert "schedule 'nope' not found" in capsys.readouterr().err
    assert [row[1:3] for row in audit_rows(conn)] == [
        ("schedule.pause", "schedule:often"),
        ("schedule.resume", "schedule:often"),
        ("schedule.trigger", "schedule:often"),
    ]


def test_an_enqueued_occurrence_reaches_the_events_websocket(settings: Settings, database_url: str) -> None:
    async def sync_and_step() -> int:
        import redis.asyncio as aioredis

        from postbox.relay.scheduler import ScheduleDuty

        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await schedule_store.sync(conn, [Schedule("ws", "noop", Timing(every=60), {})], ["noop"], now=T0)
            client = aioredis.Redis.from_url(str(settings.redis_url))
            try:
                duty = ScheduleDuty(
                    redis=client, prefix=settings.redis_prefix, clock=lambda: T0 + timedelta(seconds=61)
                )
                return await duty.step(conn)
            finally:
                await client.aclose()

    with make_client(settings) as client, client.websocket_connect("/ws/events") as ws:
        assert asyncio.run(sync_and_step()) == 1  # the API's hub subscribes: the duty publishes
        evt = ws.receive_json()
    assert (evt["type"], evt["schedule"], evt["occurrence"], evt["task"]) == (
        "enqueued",
        "ws",
        "2026-06-01T12:01:00+00:00",
        "noop",
    )


@pytest.mark.usefixtures("cli_env")
def test_a_bad_schedule_name_is_usage_error_2_on_the_cli_and_422_over_rest(
    settings: Settings, database_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    seed(database_url)
    for name in ("bad name", "nul\x00", "x" * 201):
        for command in ("pause", "resume", "trigger"):
            assert schedules_cli.main([command, name]) == 2, (command, name)
            assert "name" in capsys.readouterr().err
    with make_client(settings) as client:
        for path in ("bad%20name", "nul%00", "x" * 201):
            assert client.get(f"/api/v1/schedules/{path}").status_code == 422, path
            for action in ("pause", "resume", "trigger"):
                answer = client.post(f"/api/v1/schedules/{path}/{action}", headers={"X-API-Key": API_KEY})
                assert answer.status_code == 422, (path, action)
    assert audit_rows(conn) == []  # nothing written
