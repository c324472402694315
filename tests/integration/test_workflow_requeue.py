"""Requeueing a workflow's dead letter resumes what its death cancelled, in the requeue's transaction.

Outcomes are plain UPDATEs of the outbox (the release trigger runs on them as on
the worker's); the requeue goes through ``POST /api/v1/dlq/{id}/requeue`` and
``postbox dlq requeue``. tests/system/test_workflow_requeue.py runs the same
with a relay and a worker.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest

import postbox
from postbox.app.admin import dlq_cli
from postbox.settings import Settings
from postbox.workflow import chain, group
from tests.harness.api import make_client
from tests.harness.tasks import workflow as w
from tests.integration.test_workflows_ops import cli_env, diamond, end, states

__all__ = ["cli_env"]


def test_requeue_resumes_the_diamond_its_death_cancelled_and_it_runs_once(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ids = diamond(conn)
    a, b, c, d = ids.jobs
    end(conn, a, "dead")
    assert states(conn, ids.jobs) == [("dead", None), ("cancelled", None), ("cancelled", None), ("cancelled", None)]
    with make_client(settings) as client:
        r = client.post(f"/api/v1/dlq/{a}/requeue")
        assert r.status_code == 200, r.text
        assert r.json()["resumed"] == [b, c, d]
        assert r.json()["state"] == "pending"
        # b and c wait for a; d for b and c; nothing of theirs is left from the cancel
        assert states(conn, ids.jobs) == [("pending", None), ("waiting", 1), ("waiting", 1), ("waiting", 2)]
        row = conn.execute(
            "SELECT ended_at, (SELECT details FROM postbox.audit_log WHERE action = 'dlq.requeue')"
            " FROM postbox.workflows WHERE id = %s",
            (ids.id,),
        ).fetchone()
        conn.commit()
        assert row == (None, {"resumed": [b, c, d]})
        assert client.get(f"/api/v1/workflows/{ids.id}").json()["workflow"]["status"] == "running"
    end(conn, a, "succeeded")
    assert states(conn, ids.jobs)[1:] == [("pending", 0), ("pending", 0), ("waiting", 2)]
    end(conn, b, "succeeded")
    end(conn, c, "succeeded")
    assert states(conn, ids.jobs)[3] == ("pending", 0)
    end(conn, d, "succeeded")
    released = conn.execute(
        "SELECT count(*) FILTER (WHERE released_at IS NOT NULL) FROM postbox.outbox WHERE workflow_id = %s", (ids.id,)
    ).fetchone()
    conn.commit()
    assert released == (4,)


def test_a_job_that_another_failure_cancelled_stays_cancelled_until_that_one_is_requeued_too(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ids = postbox.enqueue_workflow(
        conn, chain(group(w.wf_plain.s(label="x"), w.wf_plain.s(label="y")), w.wf_plain.s(label="z"))
    )
    conn.commit()
    x, y, z = ids.jobs
    end(conn, x, "dead")
    end(conn, y, "dead")
    assert states(conn, ids.jobs) == [("dead", None), ("dead", None), ("cancelled", None)]
    with make_client(settings) as client:
        first = client.post(f"/api/v1/dlq/{x}/requeue").json()
        assert first["resumed"] == []  # y's death still cancels z: it would wait forever for y
        assert states(conn, ids.jobs) == [("pending", None), ("dead", None), ("cancelled", None)]
        second = client.post(f"/api/v1/dlq/{y}/requeue").json()
        assert second["resumed"] == [z]
    assert states(conn, ids.jobs) == [("pending", None), ("pending", None), ("waiting", 2)]
    end(conn, x, "succeeded")
    end(conn, y, "succeeded")
    assert states(conn, ids.jobs)[2] == ("pending", 0)


def test_a_run_edge_child_that_already_ran_is_left_alone_and_a_record_edge_forgets_the_failure(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ids = postbox.enqueue_workflow(
        conn,
        group(
            w.wf_plain.s(label="p") | w.wf_plain.s(label="q").on_upstream_failure("run"),
            w.wf_plain.s(label="r") | w.wf_plain.s(label="s").on_upstream_failure("record"),
        ),
    )
    conn.commit()
    p, q, r, _ = ids.jobs
    end(conn, p, "dead")
    end(conn, r, "dead")
    assert states(conn, ids.jobs) == [("dead", None), ("pending", 0), ("dead", None), ("pending", 0)]
    end(conn, q, "succeeded")  # q ran anyway
    failure = "SELECT failure FROM postbox.workflow_edges WHERE parent_id = %s"
    assert conn.execute(failure, (r,)).fetchone() == (
        {"state": "dead", "error_class": "PermanentError", "error": "boom"},
    )
    conn.commit()
    with make_client(settings) as client:
        assert client.post(f"/api/v1/dlq/{p}/requeue").json()["resumed"] == []
        assert client.post(f"/api/v1/dlq/{r}/requeue").json()["resumed"] == []
    # q keeps its run; s still pending (it was released) and r's recorded failure is gone: r ends again
    assert states(conn, ids.jobs) == [("pending", None), ("succeeded", 0), ("pending", None), ("pending", 0)]
    assert conn.execute(failure, (r,)).fetchone() == (None,)
    conn.commit()
    end(conn, p, "succeeded")
    assert states(conn, ids.jobs)[1] == ("succeeded", 0)


@pytest.mark.usefixtures("cli_env")
def test_postbox_dlq_requeue_says_what_waits_again(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ids = postbox.enqueue_workflow(conn, w.wf_plain.s(label="a") | w.wf_plain.s(label="b"))
    conn.commit()
    a, b = ids.jobs
    end(conn, a, "dead")
    assert dlq_cli.main(["requeue", str(a)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"job {a} requeued (state pending, attempts reset); 1 job(s) of its workflow wait for it again: [{b}]"
    )
    assert states(conn, ids.jobs) == [("pending", None), ("waiting", 1)]
    end(conn, a, "dead")
    assert dlq_cli.main(["requeue", str(a), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["resumed"] == [b]


def test_requeue_of_a_job_outside_workflows_resumes_nothing_and_a_bad_id_writes_nothing(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    ids = diamond(conn)
    with make_client(settings) as client:
        assert client.post(f"/api/v1/dlq/{ids.jobs[1]}/requeue").status_code == 409  # waiting, not dead
        assert client.post("/api/v1/dlq/0/requeue").status_code == 422
    assert states(conn, ids.jobs) == [("pending", None), ("waiting", 1), ("waiting", 1), ("waiting", 2)]
    assert conn.execute("SELECT count(*) FROM postbox.audit_log").fetchone() == (0,)
    conn.commit()
