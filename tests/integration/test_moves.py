"""Moving waiting jobs (app/services/moves.py): API, CLI, the streams, refusals; real PostgreSQL, Redis, worker."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from postbox.app.admin import jobs_cli
from postbox.app.services import moves
from postbox.app.services.audit import Actor
from postbox.relay import Relay
from postbox.settings import Settings
from postbox.streams import stream_key
from tests.harness.api import audit_rows, client_fixture, insert_job, make_client  # noqa: F401
from tests.harness.publish import publish_due
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue, fetch, finished, running_worker


async def test_a_published_job_moved_up_is_published_once_to_its_new_stream_and_runs_once(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings
) -> None:
    job_id = await enqueue(aconn, t.w_add, {"a": 1, "b": 2})
    assert await publish_due(aconn, redis, wsettings.redis_prefix) == [job_id]
    old, new = stream_key(wsettings.redis_prefix, t.QUEUE, 5), stream_key(wsettings.redis_prefix, t.QUEUE, 8)
    assert (await redis.xlen(old), await redis.xlen(new)) == (1, 0)
    with make_client(settings) as client:
        reply = client.post(f"/api/v1/jobs/{job_id}/move", json={"priority": 8})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["id"], body["state"], body["old_priority"], body["priority"], body["was_published"]) == (
        job_id,
        "pending",
        5,
        8,
        True,
    )
    assert await fetch(aconn, "SELECT state, priority, published_at, stream_id FROM postbox.outbox") == [
        ("pending", 8, None, None)
    ]
    assert await redis.xlen(old) == 0  # the old entry is dropped after the commit
    assert await publish_due(aconn, redis, wsettings.redis_prefix) == [job_id]
    assert (await redis.xlen(old), await redis.xlen(new)) == (0, 1)
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    assert await fetch(aconn, "SELECT state, attempts, publish_count FROM postbox.outbox") == [("succeeded", 1, 2)]
    assert await fetch(aconn, "SELECT attempt, outcome FROM postbox.job_attempts") == [(1, "succeeded")]
    rows = await fetch(aconn, "SELECT action, target, details->'moved', details->'priority' FROM postbox.audit_log")
    assert rows == [("job.move", f"job:{job_id}", 1, 8)]


async def test_a_published_job_moved_later_is_not_run_from_its_old_entry(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    """The old entry stays (no drop): the claim finds the job not due and acknowledges it; it runs once, later."""
    job_id = await enqueue(aconn, t.w_add, {"a": 2, "b": 2})
    await wait_until_async(lambda: relay.published_total >= 1, 10, message="the job published")
    result = await moves.move_jobs(aconn, Actor("test"), ids=[job_id], delay=1.5)
    assert [(m.id, m.was_published, m.state) for m in result.moved] == [(job_id, True, "pending")]
    async with running_worker(wsettings) as worker:
        assert await finished(worker, 1) == [(job_id, "succeeded")]
    rows = await fetch(
        aconn,
        "SELECT state, attempts, publish_count, started_at - created_at >= interval '1.5 s' FROM postbox.outbox",
    )
    assert rows == [("succeeded", 1, 2, True)]
    assert await fetch(aconn, "SELECT count(*) FROM postbox.job_attempts") == [(1,)]


def test_a_job_that_cannot_move_is_refused_with_the_reason_and_nothing_is_written(
    client: Any, conn: psycopg.Connection[Any]
) -> None:
    running = insert_job(conn, state="running", attempts=1, claimed_by="worker-0000abcd")
    done = insert_job(conn, state="succeeded")
    conn.commit()
    refused = client.post(f"/api/v1/jobs/{running}/move", json={"priority": 9})
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == (
        f"job {running} cannot move: it is running: a started job cannot move"
    )
    assert client.post(f"/api/v1/jobs/{done}/move", json={"priority": 9}).json()["error"]["message"] == (
        f"job {done} cannot move: it is already succeeded"
    )
    assert client.post("/api/v1/jobs/999999/move", json={"priority": 9}).status_code == 404
    assert client.post(f"/api/v1/jobs/{running}/move", json={"priority": 10}).status_code == 422
    nothing = client.post(f"/api/v1/jobs/{running}/move", json={})
    assert (nothing.status_code, nothing.json()["error"]["details"]["field"]) == (400, "priority")
    both = client.post(f"/api/v1/jobs/{running}/move", json={"delay_seconds": 1, "run_at": "2030-01-01T00:00:00Z"})
    assert (both.status_code, both.json()["error"]["details"]["field"]) == (400, "delay")
    assert audit_rows(conn) == []
    assert conn.execute("SELECT priority FROM postbox.outbox ORDER BY id").fetchall() == [(5,), (5,)]


def test_a_filter_moves_every_waiting_job_it_matches_in_one_audited_change(
    client: Any, conn: psycopg.Connection[Any]
) -> None:
    waiting = [insert_job(conn, state=s) for s in ("pending", "queued", "retrying")]
    other_queue = insert_job(conn, queue="otherq")
    running = insert_job(conn, state="running", attempts=1, claimed_by="worker-0000abcd")
    conn.commit()
    reply = client.post("/api/v1/jobs/move", json={"queue": "apiq", "priority": 1, "delay_seconds": 60})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [(m["id"], m["state"], m["priority"]) for m in body["moved"]] == [
        (waiting[0], "pending", 1),
        (waiting[1], "pending", 1),
        (waiting[2], "retrying", 1),
    ]
    assert (body["refused"], body["more"]) == ([], False)
    rows = conn.execute(
        "SELECT id, priority, available_at > now() + interval '50 s' FROM postbox.outbox ORDER BY id"
    ).fetchall()
    assert rows == [(w, 1, True) for w in waiting] + [(other_queue, 5, False), (running, 5, False)]
    assert [r[1:3] for r in audit_rows(conn)] == [("job.move", "jobs")]
    by_ids = client.post("/api/v1/jobs/move", json={"ids": [other_queue, running], "priority": 3}).json()
    assert [m["id"] for m in by_ids["moved"]] == [other_queue]
    assert by_ids["refused"] == [
        {"id": running, "state": "running", "reason": "it is running: a started job cannot move"}
    ]


def test_postbox_jobs_move(
    settings: Settings,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)
    job = insert_job(conn)
    second = insert_job(conn, task="api_sum")
    conn.commit()
    assert jobs_cli.main(["move", str(job), "--priority", "7"]) == 0
    assert capsys.readouterr().out.startswith(f"job {job} moved: priority 5 -> 7, due ")
    assert jobs_cli.main(["move", "--task", "api_sum", "--delay", "30", "--json"]) == 0
    out = capsys.readouterr().out
    assert f'"id": {second}' in out and '"more": false' in out
    assert jobs_cli.main(["move", str(job)]) == 2  # nothing to change: refused, named
    assert "give a priority, a run_at or a delay" in capsys.readouterr().err
    assert conn.execute("SELECT id, priority FROM postbox.outbox ORDER BY id").fetchall() == [(job, 7), (second, 5)]
    assert [r[1] for r in audit_rows(conn)] == ["job.move", "job.move"]
