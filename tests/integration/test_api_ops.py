"""REST: queues (stats, pause, resume), workers, /health, /ready, /metrics."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import redis as syncredis
from fastapi.testclient import TestClient

from postbox.settings import Settings
from postbox.streams import GROUP, stream_key
from tests.harness.api import client_fixture, insert_job, make_client  # noqa: F401
from tests.harness.redis_server import RedisServer, private_redis  # noqa: F401


def _seed_queue(conn: psycopg.Connection[Any]) -> None:
    insert_job(conn)  # backlog: due and unpublished
    insert_job(conn, available_at="2999-01-01T00:00:00Z")  # scheduled
    insert_job(conn, state="queued", published_at="now()", available_at="-infinity")
    conn.execute("UPDATE postbox.outbox SET available_at = now() - interval '60 seconds' WHERE state = 'queued'")
    insert_job(conn, state="queued", published_at="now()")
    insert_job(conn, state="running", attempts=1)
    insert_job(conn, state="retrying", attempts=1, available_at="2999-01-01T00:00:00Z")
    insert_job(conn, state="dead", attempts=5)
    insert_job(conn, state="dead", attempts=5, discarded_at="now()")
    insert_job(conn, state="succeeded", attempts=1)
    conn.commit()


def test_queue_stats_exact_counts_and_stream_numbers(
    client: TestClient, conn: psycopg.Connection[Any], settings: Settings
) -> None:
    _seed_queue(conn)
    r = syncredis.Redis.from_url(str(settings.redis_url))
    key = stream_key(settings.redis_prefix, "apiq", 5)
    r.xgroup_create(key, GROUP, id="0", mkstream=True)
    for n in range(3):
        r.xadd(key, {"id": n})
    r.xreadgroup(GROUP, "c1", {key: ">"}, count=1)
    r.close()

    stats = client.get("/api/v1/queues/apiq")
    assert stats.status_code == 200
    body = stats.json()
    age = body.pop("oldest_waiting_seconds")
    assert 60 <= age < 120
    assert body == {
        "queue": "apiq",
        "paused": False,
        "backlog": 1,
        "scheduled": 1,
        "queued": 2,
        "in_flight": 1,
        "retrying": 1,
        "dead": 1,
        "discarded": 1,
        "in_streams": 3,
        "stream_pending": 1,
        "redis_error": None,
        "limits": [],  # flow-control limits of the queue and its tasks (test_limits_api.py)
        "fair": None,  # not a fair queue (test_fair_queues_ops.py)
    }
    listed = {q["queue"]: q for q in client.get("/api/v1/queues").json()}
    assert listed["apiq"]["backlog"] == 1 and listed["apiq"]["in_streams"] == 3


def test_queue_errors(client: TestClient) -> None:
    missing = client.get("/api/v1/queues/neverseen")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "NOT_FOUND", "message": "queue 'neverseen' not found", "details": {"queue": "neverseen"}}
    }
    bad = client.get("/api/v1/queues/Bad!")
    assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "queue"
    assert client.post("/api/v1/queues/Bad!/pause").status_code == 422


def test_pause_and_resume(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    r = client.post("/api/v1/queues/apiq/pause")
    assert r.status_code == 200
    assert r.json()["queue"] == "apiq" and r.json()["paused"] is True
    assert conn.execute("SELECT paused FROM postbox.queues WHERE name = 'apiq'").fetchone() == (True,)
    conn.commit()
    assert client.get("/api/v1/queues/apiq").json()["paused"] is True
    r = client.post("/api/v1/queues/apiq/resume")
    assert r.status_code == 200 and r.json()["paused"] is False
    assert conn.execute("SELECT paused FROM postbox.queues WHERE name = 'apiq'").fetchone() == (False,)


def test_workers_list_marks_stale(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        """INSERT INTO postbox.workers (id, host, pid, queues, concurrency, started_at, last_seen, stopped_at) VALUES
           ('worker-aaaaaaaa', 'h1', 11, '{apiq}', 4, now() - interval '1 minute', now(), NULL),
           ('worker-bbbbbbbb', 'h2', 12, '{apiq}', 4, now() - interval '2 minutes',
            now() - interval '16 seconds', NULL),
           ('worker-cccccccc', 'h3', 13, '{}', 4, now() - interval '3 minutes', now() - interval '1 hour', now())"""
    )
    conn.commit()
    found = client.get("/api/v1/workers").json()  # heartbeat_interval 5 s: stale past 15 s
    assert [(w["id"], w["stale"], w["stopped"]) for w in found] == [
        ("worker-aaaaaaaa", False, False),
        ("worker-bbbbbbbb", True, False),
        ("worker-cccccccc", False, True),
    ]
    one = client.get("/api/v1/workers/worker-bbbbbbbb")
    assert one.status_code == 200 and one.json()["queues"] == ["apiq"] and one.json()["pid"] == 12
    missing = client.get("/api/v1/workers/worker-nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "code": "NOT_FOUND",
        "message": "worker 'worker-nope' not found",
        "details": {"id": "worker-nope"},
    }


def test_health_and_ready(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    r = client.get("/ready")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "checks": {"postgresql": "ok", "redis": "ok", "migrations": "ok"}}


def test_ready_is_503_naming_redis_when_redis_is_stopped(
    settings: Settings,
    private_redis: RedisServer,  # noqa: F811
) -> None:
    with make_client(settings, redis_url=private_redis.url) as c:
        assert c.get("/ready").status_code == 200
        private_redis.stop()
        r = c.get("/ready")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "NOT_READY"
        assert err["details"]["failing"] == ["redis"]
        assert err["details"]["checks"]["postgresql"] == "ok"
        assert err["details"]["checks"]["redis"].startswith("unreachable")
        assert err["message"].startswith("not ready: redis unreachable")
        # reads that do not need Redis still work; queue stats say why stream numbers are missing
        stats = c.get("/api/v1/queues")
        assert stats.status_code == 200
        assert {q["queue"]: q for q in stats.json()}["apiq"]["redis_error"] is not None
        # enqueues go on (events are muted after the first failure, so only one request waits)
        started = time.monotonic()
        for _ in range(5):
            assert c.post("/api/v1/jobs", json={"task": "api_echo"}).status_code == 201
        assert time.monotonic() - started < 4


def test_ready_is_503_naming_postgresql_when_it_is_unreachable(settings: Settings) -> None:
    with make_client(settings, database_url="postgresql://postgres@127.0.0.1:1/none") as c:
        r = c.get("/ready")
        assert r.status_code == 503
        details = r.json()["error"]["details"]
        assert details["failing"] == ["postgresql"]
        assert details["checks"]["redis"] == "ok" and details["checks"]["migrations"] == "unknown"
        assert c.get("/health").status_code == 200


def test_ready_is_503_when_migrations_are_behind(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE postbox.alembic_version SET version_num = '0001_outbox'")
    conn.commit()
    r = client.get("/ready")
    assert r.status_code == 503
    assert r.json()["error"]["details"]["failing"] == ["migrations"]
    assert r.json()["error"]["details"]["checks"]["migrations"].startswith("at 0001_outbox, head is ")


def test_metrics_exposes_queue_gauges_and_request_counters(client: TestClient, conn: psycopg.Connection[Any]) -> None:
    _seed_queue(conn)
    client.get("/api/v1/jobs/123456")
    text = client.get("/metrics").text
    assert 'postbox_queue_jobs{kind="backlog",queue="apiq"} 1.0' in text
    assert 'postbox_queue_jobs{kind="queued",queue="apiq"} 2.0' in text
    assert 'postbox_queue_jobs{kind="dead",queue="apiq"} 1.0' in text
    assert 'postbox_queue_paused{queue="apiq"} 0.0' in text
    assert 'postbox_api_requests_total{method="GET",route="/api/v1/jobs/{job_id}",status="404"} 1.0' in text
    assert 'postbox_workers{status="live"} 0.0' in text
    assert "123456" not in text  # ids never become labels
