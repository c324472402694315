"""Progress (ctx.progress): written at most once a second per run and once at its end, shown everywhere.

Real PostgreSQL and Redis, the real worker in this event loop. Every write of
the column is counted by a trigger in the test database.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.app.admin import jobs_cli
from postbox.settings import Settings
from postbox.streams import events_channel
from tests.harness.api import API_KEY, make_client
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.worker import enqueue, fetch, finished, running_worker

WRITES_DDL = """
CREATE TABLE progress_writes (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job_id bigint, progress jsonb);
CREATE FUNCTION log_progress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO progress_writes (job_id, progress) VALUES (NEW.id, NEW.progress);
    RETURN NEW;
END $$;
CREATE TRIGGER log_progress AFTER UPDATE OF progress ON postbox.outbox FOR EACH ROW EXECUTE FUNCTION log_progress();
"""


@pytest.fixture
async def writes(aconn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    await aconn.execute(WRITES_DDL)
    await aconn.commit()
    return aconn


async def test_a_tight_loop_is_written_once_a_second_and_its_last_value_at_the_end(
    wsettings: Settings, writes: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings
) -> None:
    aconn = writes
    pubsub = redis.pubsub()
    await pubsub.subscribe(events_channel(wsettings.redis_prefix))
    job_id = await enqueue(aconn, t.w_progress, {"steps": 250, "pause": 0.01})
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(worker, 1, within=30) == [(job_id, "succeeded")]
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            while not seen or seen[-1]["progress"]["done"] != 250:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    evt = orjson.loads(message["data"])
                    if evt["type"] == "progress" and evt["job_id"] == job_id:
                        seen.append(evt)
    await pubsub.aclose()
    logged = [p for (p,) in await fetch(aconn, "SELECT progress FROM progress_writes ORDER BY n")]
    # 250 reports over >= 2.5 s: the first at once, about one a second after it, the last at the end.
    assert 3 <= len(logged) <= 5, logged
    assert (logged[0]["done"], logged[0]["total"], logged[0]["note"]) == (1, 250, "step 1")
    assert (logged[-1]["done"], logged[-1]["note"], logged[-1]["attempt"]) == (250, "step 250", 1)
    assert [e["progress"]["done"] for e in seen] == [p["done"] for p in logged]
    assert {(e["attempt"], e["worker_id"]) for e in seen} == {(1, worker.id)}
    (row,) = await fetch(aconn, "SELECT state, progress FROM postbox.outbox WHERE id = %s", (job_id,))
    assert row[0] == "succeeded" and row[1] == logged[-1]

    # The API shows it (the note only to a reader allowed the contents), and so does the CLI.
    with make_client(settings) as client:
        body = client.get(f"/api/v1/jobs/{job_id}").json()
    assert {k: body["progress"][k] for k in ("done", "total", "note", "attempt")} == {
        "done": 250,
        "total": 250,
        "note": "step 250",
        "attempt": 1,
    }
    with make_client(settings, api_key=API_KEY) as client:
        hidden = client.get(f"/api/v1/jobs/{job_id}").json()
        shown = client.get(f"/api/v1/jobs/{job_id}", headers={"X-API-Key": API_KEY}).json()
    assert (hidden["redacted"], hidden["progress"]["done"], hidden["progress"]["note"]) == (True, 250, None)
    assert shown["progress"]["note"] == "step 250"


def test_postbox_jobs_get_prints_the_progress(
    settings: Settings,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)
    (job_id,) = conn.execute(
        """INSERT INTO postbox.outbox (queue, task, args, state, attempts, progress)
           VALUES ('wtest', 'w_progress', '{}', 'running', 2,
                   '{"done": 42, "total": 168, "note": "rows", "attempt": 2, "at": "2026-12-02T10:00:00+00:00"}')
           RETURNING id"""
    ).fetchone()  # type: ignore[misc]
    conn.commit()
    assert jobs_cli.main(["get", str(job_id)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("progress ")]
    assert lines == ["progress  42/168 (25%) — rows [attempt 2, 2026-12-02T10:00:00+00:00]"]


async def test_a_sync_handler_reports_from_its_thread_and_the_last_value_is_written(
    wsettings: Settings, writes: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    aconn = writes
    job_id = await enqueue(aconn, t.w_sync_progress, {"steps": 300})
    async with running_worker(wsettings) as worker:
        await publish_due(aconn, redis, wsettings.redis_prefix)
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    logged = [p for (p,) in await fetch(aconn, "SELECT progress FROM progress_writes ORDER BY n")]
    assert logged[0]["done"] == 1 and logged[-1]["done"] == 300 and len(logged) <= 3
    (row,) = await fetch(aconn, "SELECT progress FROM postbox.outbox WHERE id = %s", (job_id,))
    assert (row[0]["done"], row[0]["total"], row[0]["note"], row[0]["attempt"]) == (300, None, None, 1)


async def test_a_stale_run_writes_no_progress(
    wsettings: Settings, writes: psycopg.AsyncConnection[Any], redis: aioredis.Redis
) -> None:
    """The write is fenced by the attempt: once another claim moved attempts on, a run's reports change nothing."""
    aconn = writes
    job_id = await enqueue(aconn, t.w_progress, {"steps": 1, "pause": 0})
    await aconn.execute("UPDATE postbox.outbox SET attempts = 5 WHERE id = %s", (job_id,))
    await aconn.commit()
    from postbox import sql

    await aconn.execute(
        sql.active().JOB_SET_PROGRESS,
        {"id": job_id, "attempt": 4, "worker": "worker-old", "progress": '{"done": 1, "total": null, "note": null}'},
    )
    await aconn.commit()
    assert await fetch(aconn, "SELECT count(*) FROM progress_writes") == [(0,)]
