"""Result notifications only where someone listens (migration 0014), on real PostgreSQL.

Absence is shown without waiting for it: after the statement under test the test sends its own
``sentinel`` notification, and PostgreSQL delivers notifications in commit order, so anything the
statement sent arrives before it.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from postbox import pgarray, results, sql
from postbox.outcomes import Outcome, outcome_params
from tests.harness.wait import wait_until_async

WORKER = "worker-aaaaaaaa"


@dataclass(frozen=True)
class Attempt:
    id: int
    attempt: int = 1


def running_jobs(conn: psycopg.Connection[Any], n: int, *, workflow: bool = False) -> list[int]:
    """``n`` jobs claimed by :data:`WORKER` (attempt 1); in a workflow of their own if asked."""
    workflow_id = None
    if workflow:
        row = conn.execute("INSERT INTO postbox.workflows (name, jobs) VALUES ('w', %s) RETURNING id", (n,)).fetchone()
        assert row is not None
        workflow_id = row[0]
    rows = conn.execute(
        """INSERT INTO postbox.outbox (queue, task, state, attempts, claimed_by, started_at, workflow_id)
           SELECT 'default', 'noop', 'running', 1, %s, now(), %s FROM generate_series(1, %s) RETURNING id""",
        (WORKER, workflow_id, n),
    ).fetchall()
    conn.commit()
    return [r[0] for r in rows]


def succeed(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    items = [(Attempt(i), Outcome(state="succeeded", kind="succeeded")) for i in ids]
    conn.execute(sql.active().JOB_RECORD_OUTCOMES, outcome_params(WORKER, items, lambda _job: 0.0)).fetchall()
    conn.commit()


def heard(listener: psycopg.Connection[Any]) -> list[str]:
    """Every ``postbox_results`` payload up to this test's sentinel."""
    listener.execute("SELECT pg_notify('postbox_results', 'sentinel')")
    got = []
    for note in listener.notifies(timeout=10):
        if note.payload == "sentinel":
            return got
        got.append(note.payload)
    raise AssertionError(f"no sentinel; heard {got}")


def listening(database_url: str) -> psycopg.Connection[Any]:
    listener = psycopg.connect(database_url, autocommit=True)
    listener.execute("LISTEN postbox_results")
    return listener


def add_waiter(conn: psycopg.Connection[Any], job_id: int) -> int:
    row = conn.execute(sql.active().RESULT_WAITER_ADD, {"job": job_id, "seconds": 60}).fetchone()
    assert row is not None
    conn.commit()
    return int(row[0])


def registered(conn: psycopg.Connection[Any], job_id: int) -> bool:
    row = conn.execute("SELECT count(*) FROM postbox.result_waiters WHERE job_id = %s", (job_id,)).fetchone()
    conn.commit()
    return row == (1,)


async def waiter(conn: psycopg.Connection[Any], database_url: str, job_id: int) -> asyncio.Task[results.JobResult]:
    """``wait_result`` under way for ``job_id``, once it has registered (its read and LISTEN come next)."""
    waiting = asyncio.create_task(results.wait_result(job_id, 60, database_url=database_url))
    await wait_until_async(lambda: registered(conn, job_id), 10, message="the waiter registered")
    return waiting


def test_outcomes_nobody_waits_for_send_no_notification(conn: psycopg.Connection[Any], database_url: str) -> None:
    ids = running_jobs(conn, 3)
    with listening(database_url) as listener:
        succeed(conn, ids)
        assert heard(listener) == []
    assert conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'").fetchone() == (3,)


def test_a_waited_for_job_and_a_workflows_jobs_are_announced_together(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    [plain, waited] = running_jobs(conn, 2)
    in_workflow = running_jobs(conn, 2, workflow=True)
    add_waiter(conn, waited)
    with listening(database_url) as listener:
        succeed(conn, [plain, waited, *in_workflow])
        assert heard(listener) == [",".join(map(str, sorted([waited, *in_workflow])))]


def test_a_workflows_jobs_are_announced_with_no_waiter_registered_anywhere(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    """The notice is looked for when an ended job belongs to a workflow (migration 0020), waiters or not."""
    [plain] = running_jobs(conn, 1)
    in_workflow = running_jobs(conn, 2, workflow=True)
    assert conn.execute("SELECT count(*) FROM postbox.result_waiters").fetchone() == (0,)
    with listening(database_url) as listener:
        succeed(conn, [plain, *in_workflow])
        assert heard(listener) == [",".join(map(str, sorted(in_workflow)))]


def test_a_retry_of_a_workflows_job_is_not_announced(conn: psycopg.Connection[Any], database_url: str) -> None:
    [job] = running_jobs(conn, 1, workflow=True)
    items = [(Attempt(job), Outcome(state="retrying", kind="retry", delay=60.0))]
    with listening(database_url) as listener:
        rows = conn.execute(sql.active().JOB_RECORD_OUTCOMES, outcome_params(WORKER, items, lambda _j: 0.0)).fetchall()
        conn.commit()
        assert heard(listener) == []
    assert rows == [(job, 0)]


def test_jobs_passed_on_from_their_own_transactions_are_announced_with_a_plain_batch(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    """A batch of plain jobs, no waiter anywhere, and a workflow's job whose success committed in its own
    ctx.transaction() passed on (``also_notify``): that job is announced (migration 0020 looks for the
    notice whenever jobs are passed on)."""
    [plain] = running_jobs(conn, 1)
    [own] = running_jobs(conn, 1, workflow=True)
    conn.execute(sql.active().JOB_RECORD_SUCCESS, {"id": own, "worker": WORKER, "attempt": 1})
    conn.commit()
    items = [(Attempt(plain), Outcome(state="succeeded", kind="succeeded"))]
    with listening(database_url) as listener:
        params = outcome_params(WORKER, items, lambda _j: 0.0, also_notify=[own])
        rows = conn.execute(sql.active().JOB_RECORD_OUTCOMES, params).fetchall()
        conn.commit()
        assert heard(listener) == [str(own)]
    assert rows == [(plain, 1)]


def test_jobs_that_committed_in_their_own_transaction_are_announced_only_if_waited_for(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    """The worker's notice for ctx.transaction() jobs (RESULTS_NOTIFY) asks the same question."""
    [plain, waited] = running_jobs(conn, 2)
    add_waiter(conn, waited)
    with listening(database_url) as listener:
        conn.execute(sql.active().RESULTS_NOTIFY, {"ids": pgarray.ints([plain])})
        conn.commit()
        conn.execute(sql.active().RESULTS_NOTIFY, {"ids": pgarray.ints([plain, waited])})
        conn.commit()
        assert heard(listener) == [str(waited)]


def test_a_success_in_its_own_transaction_is_announced_at_its_commit_if_someone_listens(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    """record_success() (migration 0016) names the job if it has a waiter and leaves its result to the worker."""
    [plain, waited, keeps] = running_jobs(conn, 3)
    conn.execute("UPDATE postbox.outbox SET keep_result = true WHERE id = %s", (keeps,))
    conn.commit()
    for job_id in (waited, keeps):
        add_waiter(conn, job_id)
    with listening(database_url) as listener:
        said = []
        for job_id in (plain, waited, keeps):
            conn.execute(sql.active().JOB_RECORD_SUCCESS, {"id": job_id, "worker": WORKER, "attempt": 1})
            before = heard(listener)
            conn.commit()
            said.append((before, heard(listener)))
    # (before the commit, at the commit); the job that keeps a result: once the worker set it
    assert said == [([], []), ([], [str(waited)]), ([], [])]
    states = conn.execute("SELECT state FROM postbox.outbox ORDER BY id").fetchall()
    assert states == [("succeeded",)] * 3


async def test_wait_result_is_woken_by_the_outcome_and_leaves_no_waiter_behind(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    [job] = running_jobs(conn, 1)
    waiting = await waiter(conn, database_url, job)
    with listening(database_url) as listener:
        await asyncio.to_thread(succeed, conn, [job])
        assert heard(listener) == [str(job)]
    result = await asyncio.wait_for(waiting, 10)
    assert (result.job_id, result.state) == (job, "succeeded")
    assert conn.execute("SELECT count(*) FROM postbox.result_waiters").fetchone() == (0,)


async def test_an_end_that_sent_nothing_is_still_read_by_the_waiter(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    """An outcome whose check for waiters ran just before the registration sends nothing: the re-read finds it."""
    [job] = running_jobs(conn, 1)
    waiting = await waiter(conn, database_url, job)
    conn.execute("UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() WHERE id = %s", (job,))
    conn.commit()  # no NOTIFY at all, as for that outcome
    result = await asyncio.wait_for(waiting, 10)  # the first re-read comes half a second after registering
    assert (result.job_id, result.state) == (job, "succeeded")


def test_a_waiter_that_died_is_cleared_by_the_next_registration(conn: psycopg.Connection[Any]) -> None:
    [a, b] = running_jobs(conn, 2)
    conn.execute("INSERT INTO postbox.result_waiters (job_id, until) VALUES (%s, now() - interval '2 minutes')", (a,))
    conn.execute("INSERT INTO postbox.result_waiters (job_id, until) VALUES (%s, now() - interval '10 seconds')", (a,))
    conn.commit()
    add_waiter(conn, b)
    left = conn.execute("SELECT job_id, until > now() FROM postbox.result_waiters ORDER BY id").fetchall()
    assert left == [(a, False), (b, True)]  # a minute past its deadline goes; a recent one stays


async def test_a_waiter_cancelled_while_it_removes_its_registration_still_closes_its_session(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    """A caller's own deadline (the API's ``?wait=``) can cancel the wait again while it cleans up: its session
    still closes, and nothing is left for the garbage collector to warn about."""
    [job] = running_jobs(conn, 1)
    waiting = await waiter(conn, database_url, job)
    # Past its registration's reply too: a cancel landing while that reply is read leaves no id to remove
    # (the row then goes with its deadline), and this test is about the removal.
    await wait_until_async(lambda: waiting_for_notifications(conn), 10, message="the waiter in its wait")
    with psycopg.connect(database_url) as holder:  # the registration row locked: its removal waits on it
        holder.execute("SELECT 1 FROM postbox.result_waiters WHERE job_id = %s FOR UPDATE", (job,))
        waiting.cancel()  # the first cancel ends the wait; the removal then waits on the lock
        await wait_until_async(
            lambda: session_states(conn) == [("active", "Lock")], 10, message="the removal waiting on the lock"
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            waiting.cancel()  # the second: the caller's deadline, during the removal
            with pytest.raises(asyncio.CancelledError):
                await waiting
            del waiting
            await wait_until_async(lambda: session_states(conn) == [], 10, message="the waiter's session closed")
            gc.collect()
        holder.rollback()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def waiting_for_notifications(conn: psycopg.Connection[Any]) -> bool:
    """The one result waiter's session is idle after reading the job's state: in its wait for a notification."""
    rows = conn.execute(
        "SELECT state, query FROM pg_stat_activity"
        " WHERE application_name = 'postbox-wait-result' AND datname = current_database()"
    ).fetchall()
    conn.commit()
    return len(rows) == 1 and rows[0][0] == "idle" and "outbox" in str(rows[0][1])


def session_states(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None]]:
    """(state, wait event type) of every result waiter's session of this database."""
    rows = conn.execute(
        "SELECT state, wait_event_type FROM pg_stat_activity"
        " WHERE application_name = 'postbox-wait-result' AND datname = current_database()"
    ).fetchall()
    conn.commit()
    return [(str(state), wait) for state, wait in rows]
