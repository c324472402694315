"""Operating workflows: ``/api/v1/workflows`` and ``postbox workflows`` on a real PostgreSQL.

Outcomes are written with plain UPDATEs of the outbox (what every outcome
statement does to the row): the release trigger runs on them as it does on the
worker's, so no worker is needed to put a workflow in a state.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest

import postbox
from postbox.app.admin import workflows_cli
from postbox.settings import Settings
from postbox.workflow import chain, group
from tests.harness.api import API_KEY, audit_rows, make_client
from tests.harness.tasks import workflow as w


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("POSTBOX_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("POSTBOX_REDIS_PREFIX", settings.redis_prefix)


def end(conn: psycopg.Connection[Any], job_id: int, state: str) -> None:
    conn.execute(
        "UPDATE postbox.outbox SET state = %s, finished_at = now(), last_error_class = CASE WHEN %s = 'dead'"
        " THEN 'PermanentError' END, last_error = CASE WHEN %s = 'dead' THEN 'boom' END WHERE id = %s",
        (state, state, state, job_id),
    )
    conn.commit()


def states(conn: psycopg.Connection[Any], ids: tuple[int, ...]) -> list[tuple[str, int | None]]:
    rows = dict(
        (r[0], (r[1], r[2]))
        for r in conn.execute("SELECT id, state, waiting_on FROM postbox.outbox WHERE id = ANY(%s)", (list(ids),))
    )
    conn.commit()
    return [rows[i] for i in ids]


def diamond(conn: psycopg.Connection[Any], name: str = "diamond") -> postbox.WorkflowIds:
    ids = postbox.enqueue_workflow(
        conn,
        chain(
            w.wf_plain.s(label="a"), group(w.wf_plain.s(label="b"), w.wf_plain.s(label="c")), w.wf_plain.s(label="d")
        ),
        name=name,
    )
    conn.commit()
    return ids


def test_get_list_and_retry_over_rest_resume_where_it_failed(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    ids = diamond(conn)
    a, b, c, d = ids.jobs
    other = diamond(conn, "other")
    end(conn, a, "succeeded")
    end(conn, b, "dead")
    end(conn, c, "succeeded")
    assert states(conn, ids.jobs) == [("succeeded", None), ("dead", 0), ("succeeded", 0), ("cancelled", None)]
    with make_client(settings, api_key=API_KEY) as client:
        got = client.get(f"/api/v1/workflows/{ids.id}")
        assert got.status_code == 200
        body = got.json()
        assert body["workflow"]["status"] == "failed"
        assert body["workflow"]["counts"] == {"succeeded": 2, "dead": 1, "cancelled": 1}
        assert [(j["id"], j["state"]) for j in body["jobs"]] == [
            (a, "succeeded"), (b, "dead"), (c, "succeeded"), (d, "cancelled")
        ]  # fmt: skip
        assert [(e["parent"], e["child"], e["on_failure"]) for e in body["edges"]] == [
            (a, b, "cancel"), (a, c, "cancel"), (b, d, "cancel"), (c, d, "cancel")
        ]  # fmt: skip
        assert body["jobs"][3]["last_error_class"] == "UpstreamFailed"

        listed = client.get("/api/v1/workflows").json()
        assert [(x["id"], x["status"]) for x in listed["items"]] == [(other.id, "running"), (ids.id, "failed")]
        assert [x["id"] for x in client.get("/api/v1/workflows?status=failed").json()["items"]] == [ids.id]
        assert [x["id"] for x in client.get("/api/v1/workflows?name=other").json()["items"]] == [other.id]
        first = client.get("/api/v1/workflows?limit=1").json()
        assert [x["id"] for x in first["items"]] == [other.id] and first["next_cursor"]
        after = client.get(f"/api/v1/workflows?limit=1&cursor={first['next_cursor']}").json()
        assert [x["id"] for x in after["items"]] == [ids.id] and after["next_cursor"] is None

        assert client.get("/api/v1/workflows/999999").status_code == 404
        assert client.get("/api/v1/workflows/0").status_code == 422
        assert client.get("/api/v1/workflows?status=stuck").status_code == 422

        assert client.post(f"/api/v1/workflows/{ids.id}/retry").status_code == 401  # destructive: the key
        retried = client.post(f"/api/v1/workflows/{ids.id}/retry", headers={"X-API-Key": API_KEY})
        assert retried.status_code == 200, retried.text
        assert retried.json()["retried"] == [b, d]
        assert retried.json()["workflow"]["status"] == "running"
        # b runs again; d waits for b only (c's success still counts); a and c do not run again
        assert states(conn, ids.jobs) == [("succeeded", None), ("pending", 0), ("succeeded", 0), ("waiting", 1)]
        again = client.post(f"/api/v1/workflows/{ids.id}/retry", headers={"X-API-Key": API_KEY})
        assert again.status_code == 409
    end(conn, b, "succeeded")
    assert states(conn, ids.jobs)[3] == ("pending", 0)
    end(conn, d, "succeeded")
    assert [row[1:3] for row in audit_rows(conn)] == [("workflow.retry", f"workflow:{ids.id}")]


def test_retry_of_a_wide_join_recounts_its_shards(conn: psycopg.Connection[Any]) -> None:
    ids = postbox.enqueue_workflow(
        conn, group(w.wf_plain.s(label=str(i)) for i in range(40)) | w.wf_plain.s(label="cb").on_upstream_failure("run")
    )
    conn.commit()
    *children, callback = ids.jobs
    for child in children[:30]:
        end(conn, child, "succeeded")
    for child in children[30:39]:
        end(conn, child, "cancelled")
    assert states(conn, (callback,)) == [("waiting", 1)]
    from postbox.app.services.audit import Actor
    from postbox.app.services.workflows import retry_workflow

    async def retry() -> Any:
        async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as aconn:
            return await retry_workflow(aconn, ids.id, Actor("test"))

    import asyncio

    change = asyncio.run(retry())
    assert change.retried == children[30:39]
    remaining = conn.execute(
        "SELECT sum(remaining) FROM postbox.workflow_joins WHERE job_id = %s", (callback,)
    ).fetchone()
    conn.commit()
    assert remaining == (10,)  # the nine retried and the one never ended
    for child in children[30:]:
        end(conn, child, "succeeded")
    assert states(conn, (callback,)) == [("pending", 0)]


@pytest.mark.usefixtures("cli_env")
def test_postbox_workflows_list_get_cancel_retry(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ids = diamond(conn)
    a, b, c, d = ids.jobs
    conn.execute("UPDATE postbox.outbox SET state = 'running', claimed_by = 'worker-x' WHERE id = %s", (a,))
    conn.commit()
    assert workflows_cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "diamond" in out and "running" in out and "0/4" in out
    assert workflows_cli.main(["get", str(ids.id)]) == 0
    out = capsys.readouterr().out
    assert f"workflow {ids.id} diamond: running, 0/4 jobs ended" in out
    assert f"{a},{b}" not in out and str(a) in out
    assert workflows_cli.main(["cancel", str(ids.id), "--json"]) == 0
    change = orjson.loads(capsys.readouterr().out)
    assert change["cancelled"] == [b, c, d] and change["stopping"] == [a]
    assert states(conn, ids.jobs) == [("running", None), ("cancelled", None), ("cancelled", None), ("cancelled", None)]
    row = conn.execute("SELECT cancel_requested_at IS NOT NULL FROM postbox.outbox WHERE id = %s", (a,)).fetchone()
    conn.commit()
    assert row == (True,)
    end(conn, a, "cancelled")  # the running job stops
    assert workflows_cli.main(["cancel", str(ids.id)]) == 1  # nothing left to cancel
    assert "nothing to cancel" in capsys.readouterr().err
    assert workflows_cli.main(["get", str(ids.id), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["workflow"]["status"] == "cancelled"
    assert workflows_cli.main(["retry", str(ids.id)]) == 0
    assert "4 jobs to run again" in capsys.readouterr().out
    assert states(conn, ids.jobs) == [("pending", 0), ("waiting", 1), ("waiting", 1), ("waiting", 2)]
    assert workflows_cli.main(["get", "0"]) == 2
    assert workflows_cli.main(["get", "99999"]) == 1
    assert [row[1] for row in audit_rows(conn)] == ["workflow.cancel", "workflow.retry"]


def test_metrics_count_active_workflows_and_waiting_jobs(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    first, second = diamond(conn), diamond(conn, "second")
    end(conn, second.jobs[0], "cancelled")
    with make_client(settings) as client:
        text = client.get("/metrics").text
    assert "postbox_workflows_active 1.0" in text  # the second's jobs were all cancelled with its head
    assert 'postbox_queue_waiting_jobs{queue="wtest"} 3.0' in text  # the first's b, c and d
    assert len(first.jobs) == 4


def test_retention_deletes_a_workflows_rows_with_its_last_jobs(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    from postbox import retention

    done, live = diamond(conn, "done"), diamond(conn, "live")
    for job in done.jobs:
        end(conn, job, "succeeded")
    end(conn, live.jobs[0], "succeeded")
    conn.execute("UPDATE postbox.outbox SET finished_at = now() - interval '30 days' WHERE finished_at IS NOT NULL")
    conn.commit()
    report = retention.prune(conn, settings.model_copy(update={"retention_finished_days": 7}))
    assert report.finished == 5  # the four jobs of the first, the head of the second

    def left(table: str, key: str, workflow_id: int) -> int:
        row = conn.execute(f"SELECT count(*) FROM postbox.{table} WHERE {key} = %s", (workflow_id,)).fetchone()
        conn.commit()
        return int(row[0]) if row else -1

    assert [left("workflows", "id", w.id) for w in (done, live)] == [0, 1]
    # the live workflow keeps its edges: its waiting job still counts and reads them
    assert [left("workflow_edges", "workflow_id", w.id) for w in (done, live)] == [0, 4]
    assert states(conn, live.jobs[1:]) == [("pending", 0), ("pending", 0), ("waiting", 2)]


def test_cancelling_one_waiting_job_cancels_what_waits_on_it(settings: Settings, conn: psycopg.Connection[Any]) -> None:
    ids = diamond(conn)
    b = ids.jobs[1]
    with make_client(settings, api_key=API_KEY) as client:
        done = client.post(f"/api/v1/jobs/{b}/cancel", headers={"X-API-Key": API_KEY})
    assert done.status_code == 202, done.text
    assert done.json()["state"] == "cancelled"
    # d is cancelled in the same statement (policy cancel); c still waits for a
    assert states(conn, ids.jobs) == [("pending", None), ("cancelled", 1), ("waiting", 1), ("cancelled", None)]
    end(conn, ids.jobs[0], "succeeded")
    assert states(conn, ids.jobs)[1:] == [("cancelled", 1), ("pending", 0), ("cancelled", None)]
