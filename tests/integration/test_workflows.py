"""Workflows on real PostgreSQL and Redis: the release of dependents commits with the upstream job's outcome.

The worker runs in this process, the real relay publishes what is released.
Effects are rows of ``wf_log`` written inside each job's ``ctx.transaction()``
(tests/harness/tasks/workflow.py): one row per job is the effect committed once.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import psycopg
import pytest

import postbox
from postbox import sql
from postbox.relay import Relay
from postbox.settings import Settings
from postbox.workflow import chain, chord, enqueue_workflow_async, group, shard_count
from tests.harness.tasks import workflow as w
from tests.harness.wait import wait_until_async
from tests.harness.worker import fetch, fetchval, running_worker


@pytest.fixture
async def wlog(aconn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    await aconn.execute(w.LOG_DDL)
    await aconn.commit()
    return aconn


async def states(aconn: psycopg.AsyncConnection[Any], ids: tuple[int, ...]) -> list[str]:
    rows = await fetch(aconn, "SELECT id, state FROM postbox.outbox WHERE id = ANY(%s) ORDER BY id", (list(ids),))
    by_id = dict(rows)
    return [by_id[i] for i in ids]


async def all_ended(aconn: psycopg.AsyncConnection[Any], workflow_id: int, within: float = 30.0) -> None:
    seen: list[Any] = []

    async def ended() -> bool:
        rows = await fetch(
            aconn,
            "SELECT id, task, state, attempts, waiting_on, last_error FROM postbox.outbox WHERE workflow_id = %s"
            " AND state NOT IN ('succeeded', 'dead', 'cancelled', 'expired') ORDER BY id",
            (workflow_id,),
        )
        seen[:] = rows
        return not rows

    await wait_until_async(ended, within, message=lambda: f"every job of workflow {workflow_id} ended: left {seen[:5]}")


async def logged(aconn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    return await fetch(aconn, "SELECT label, job_id, attempt, upstream FROM wf_log ORDER BY id")


async def test_a_chain_runs_in_order_each_step_after_the_commit_of_the_one_before(
    wsettings: Settings, wlog: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = wlog
    flow = chain(w.wf_step.s(label="a"), w.wf_step.s(label="b"), w.wf_step.s(label="c"))
    ids = await enqueue_workflow_async(aconn, flow, name="abc")
    assert await states(aconn, ids.jobs) == ["pending", "waiting", "waiting"]  # not committed yet: ours only
    await aconn.commit()
    async with running_worker(wsettings):
        await all_ended(aconn, ids.id)
    assert [(label, job) for label, job, _, _ in await logged(aconn)] == list(zip("abc", ids.jobs, strict=True))
    # each step started after the step before had committed
    gaps = await fetch(
        aconn,
        "SELECT b.started_at >= a.released_at FROM postbox.outbox a JOIN postbox.workflow_edges e ON e.parent_id = a.id"
        " JOIN postbox.outbox b ON b.id = e.child_id WHERE a.workflow_id = %s",
        (ids.id,),
    )
    assert gaps == [(True,), (True,)]
    assert await states(aconn, ids.jobs) == ["succeeded"] * 3


async def test_a_rolled_back_producer_leaves_no_workflow(
    wsettings: Settings, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await enqueue_workflow_async(aconn, chain(w.wf_plain.s(label="a"), w.wf_plain.s(label="b")))
    await aconn.rollback()
    assert await fetch(aconn, "SELECT count(*) FROM postbox.outbox") == [(0,)]
    assert await fetch(aconn, "SELECT count(*) FROM postbox.workflows") == [(0,)]
    assert await fetch(aconn, "SELECT count(*) FROM postbox.workflow_edges") == [(0,)]


async def test_a_chord_reads_every_result_of_its_group_once_all_have_committed(
    wsettings: Settings, wlog: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = wlog
    header = group(w.wf_step.s(label=f"s{i}") for i in range(5))
    flow = chord(group(header, w.wf_plain.s(label="plain")), w.wf_collect.s(label="callback"))
    ids = await enqueue_workflow_async(aconn, flow)
    await aconn.commit()
    async with running_worker(wsettings):
        await all_ended(aconn, ids.id)
    rows = await logged(aconn)
    callbacks = [row for row in rows if row[0] == "callback"]
    assert len(callbacks) == 1
    seen = callbacks[0][3]
    # the ctx.transaction() steps' results are written after their commit: the callback waited for them
    assert seen["steps"] == [f"s{i}" for i in range(5)]
    assert seen["results"] == sorted([f"s{i}" for i in range(5)] + ["plain"])
    assert seen["states"] == ["succeeded"] * 6
    assert await fetchval(aconn, "SELECT result FROM postbox.outbox WHERE id = %s", (ids.jobs[-1],)) == 6


async def test_a_wide_fan_in_under_many_workers_releases_its_callback_exactly_once(
    wsettings: Settings, wlog: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = wlog
    n = 300
    flow = group(w.wf_step.s(label=f"c{i}") for i in range(n)) | w.wf_collect.s(label="callback")
    ids = await enqueue_workflow_async(aconn, flow)
    await aconn.commit()
    callback = ids.jobs[-1]
    assert await fetch(
        aconn, "SELECT count(*), sum(remaining) FROM postbox.workflow_joins WHERE job_id = %s", (callback,)
    ) == [(shard_count(n), n)]
    settings = wsettings.model_copy(update={"concurrency": 20})
    async with running_worker(settings), running_worker(settings), running_worker(settings):
        await all_ended(aconn, ids.id, within=60)
    rows = await logged(aconn)
    assert len(rows) == n + 1
    assert [row[0] for row in rows].count("callback") == 1
    assert rows[-1][0] == "callback"  # after every child's effect
    assert len(rows[-1][3]["steps"]) == n
    assert await fetch(aconn, "SELECT state, waiting_on, attempts FROM postbox.outbox WHERE id = %s", (callback,)) == [
        ("succeeded", 0, 1)
    ]
    assert await fetch(aconn, "SELECT sum(remaining) FROM postbox.workflow_joins WHERE job_id = %s", (callback,)) == [
        (0,)
    ]


def test_concurrent_outcome_batches_release_the_join_once_and_never_deadlock(database_url: str) -> None:
    """Sixteen connections end 2,000 parents in random batches at once, as outcome statements do."""
    parents = 2000
    with psycopg.connect(database_url) as conn:
        ids = _seed_fan_in(conn, parents)
    callback = ids[-1]
    batches = [ids[:-1][i : i + 37] for i in range(0, parents, 37)]
    random.Random(7).shuffle(batches)
    errors: list[BaseException] = []

    def finish(mine: list[list[int]]) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                for batch in mine:
                    random.shuffle(batch)
                    conn.execute(
                        "UPDATE postbox.outbox SET state = 'succeeded', finished_at = now()"
                        " WHERE id = ANY(%s) AND state = 'running'",
                        (batch,),
                    )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(batches[k::16],)) for k in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT state, waiting_on FROM postbox.outbox WHERE id = %s", (callback,)).fetchall() == [
            ("pending", 0)
        ]
        assert conn.execute(
            "SELECT count(*) FROM postbox.outbox WHERE workflow_id IS NOT NULL AND released_at IS NOT NULL"
        ).fetchall() == [(parents,)]


def _seed_fan_in(conn: psycopg.Connection[Any], parents: int) -> list[int]:
    """A fan-in of ``parents`` jobs, all set running (as claimed), committed."""
    flow = group(w.wf_plain.s(label=f"p{i}") for i in range(parents)) | w.wf_plain.s(label="cb")
    ids = postbox.enqueue_workflow(conn, flow)
    conn.execute("UPDATE postbox.outbox SET state = 'running' WHERE id = ANY(%s)", (list(ids.jobs[:-1]),))
    conn.commit()
    return list(ids.jobs)


def test_a_stale_attempt_releases_nothing(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        flow = chain(w.wf_plain.s(label="a"), w.wf_plain.s(label="b"))
        a, b = postbox.enqueue_workflow(conn, flow).jobs
        conn.execute(
            "UPDATE postbox.outbox SET state = 'running', attempts = 2, claimed_by = 'worker-new' WHERE id = %s", (a,)
        )
        conn.commit()
        statements = sql.active()
        # attempt 1's success inside its own transaction: the fence refuses it, nothing commits
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(statements.JOB_RECORD_SUCCESS, {"id": a, "worker": "worker-old", "attempt": 1})
        assert refused.value.sqlstate == sql.STALE_ATTEMPT_SQLSTATE
        conn.rollback()
        # the worker's batch statement: a stale attempt matches no row
        rows = conn.execute(
            statements.JOB_RECORD_OUTCOMES,
            {
                "ids": [a], "worker": "worker-old", "states": ["succeeded"], "attempts": [1], "delays": [0.0],
                "results": [None], "result_ttls": [60.0], "error_classes": [None], "errors": [None],
                "outcomes": ["succeeded"], "tracebacks": [None], "notify": False, "also_notify": None,
            },
        ).fetchall()  # fmt: skip
        conn.commit()
        assert rows == []
        assert conn.execute("SELECT state, waiting_on FROM postbox.outbox WHERE id = %s", (b,)).fetchall() == [
            ("waiting", 1)
        ]
        # the current attempt's success releases b, in its own statement
        conn.execute(statements.JOB_RECORD_SUCCESS, {"id": a, "worker": "worker-new", "attempt": 2})
        assert conn.execute("SELECT state FROM postbox.outbox WHERE id = %s", (b,)).fetchall() == [("pending",)]
        conn.rollback()  # ... and a rollback of that transaction takes the release back with it
        assert conn.execute("SELECT state FROM postbox.outbox WHERE id = %s", (b,)).fetchall() == [("waiting",)]


async def test_a_child_whose_transaction_rolls_back_releases_nothing(
    wsettings: Settings, wlog: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = wlog
    flow = chain(w.wf_rollback_once.s(label="child"), w.wf_step.s(label="after"))
    ids = await enqueue_workflow_async(aconn, flow)
    await aconn.commit()
    child, after = ids.jobs
    async with running_worker(wsettings) as worker:
        first = await asyncio.wait_for(worker.signals.finished.get(), 15)
        assert first == (child, "retry")
        assert await fetch(aconn, "SELECT state, waiting_on FROM postbox.outbox WHERE id = %s", (after,)) == [
            ("waiting", 1)
        ]
        assert await fetch(aconn, "SELECT label FROM wf_log") == []  # attempt 1's effect rolled back
        await all_ended(aconn, ids.id)
    assert [(label, attempt) for label, _, attempt, _ in await logged(aconn)] == [("child", 2), ("after", 1)]


async def test_failure_policies_cancel_run_and_record(
    wsettings: Settings, wlog: psycopg.AsyncConnection[Any], relay: Relay
) -> None:
    aconn = wlog
    cancelled = await enqueue_workflow_async(
        aconn, chain(w.wf_fail.s(label="x"), w.wf_step.s(label="never1"), w.wf_step.s(label="never2"))
    )
    run = await enqueue_workflow_async(
        aconn,
        chain(group(w.wf_fail.s(label="y"), w.wf_step.s(label="ok")), w.wf_collect.s(label="ran")),
        on_failure="run",
    )
    recorded = await enqueue_workflow_async(
        aconn,
        chain(
            group(w.wf_fail.s(label="z"), w.wf_step.s(label="ok2")),
            w.wf_collect.s(label="recorded").on_upstream_failure("record"),
        ),
    )
    await aconn.commit()
    async with running_worker(wsettings):
        for ids in (cancelled, run, recorded):
            await all_ended(aconn, ids.id)
    assert await states(aconn, cancelled.jobs) == ["dead", "cancelled", "cancelled"]
    assert await fetch(
        aconn, "SELECT DISTINCT last_error_class FROM postbox.outbox WHERE id = ANY(%s)", (list(cancelled.jobs[1:]),)
    ) == [("UpstreamFailed",)]
    by_label = {label: upstream for label, _, _, upstream in await logged(aconn)}
    assert "never1" not in by_label and "never2" not in by_label
    assert by_label["ran"] == {"results": ["ok"], "states": ["dead", "succeeded"], "failures": [], "steps": ["ok"]}
    assert by_label["recorded"] == {
        "results": ["ok2"], "states": ["dead", "succeeded"], "failures": ["dead"], "steps": ["ok2"]
    }  # fmt: skip
    failure = await fetchval(
        aconn, "SELECT failure FROM postbox.workflow_edges WHERE child_id = %s AND failure IS NOT NULL",
        (recorded.jobs[-1],),
    )  # fmt: skip
    assert failure == {"state": "dead", "error_class": "PermanentError", "error": "z failed"}


async def test_expired_upstream_counts_as_failed(database_url: str, aconn: psycopg.AsyncConnection[Any]) -> None:
    ids = await enqueue_workflow_async(aconn, chain(w.wf_plain.s(label="a"), w.wf_plain.s(label="b")))
    await aconn.execute("UPDATE postbox.outbox SET state = 'expired' WHERE id = %s", (ids.jobs[0],))
    await aconn.commit()
    assert await states(aconn, ids.jobs) == ["expired", "cancelled"]


async def test_nothing_waits_forever_after_a_cascade_down_a_long_chain(aconn: psycopg.AsyncConnection[Any]) -> None:
    ids = await enqueue_workflow_async(aconn, chain(*(w.wf_plain.s(label=str(i)) for i in range(500))))
    await aconn.execute("UPDATE postbox.outbox SET state = 'dead' WHERE id = %s", (ids.jobs[0],))
    await aconn.commit()
    assert await fetch(
        aconn, "SELECT state, count(*) FROM postbox.outbox WHERE workflow_id = %s GROUP BY 1 ORDER BY 1", (ids.id,)
    ) == [("cancelled", 499), ("dead", 1)]
