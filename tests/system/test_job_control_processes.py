"""Job control (issue 32) with real processes: debounce and throttle raced from SQL and REST, moves and
encrypted arguments under a worker SIGKILL and a Redis flush, a bad key refused at start.

Relays, workers and the API are ``python -m postbox...`` processes on a private Redis
(flushed by some tests); every process is killed in teardown whatever happens.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

import postbox
from postbox import definitions, encryption
from postbox.registry import default_registry
from tests.harness.fleet import LEASES, Fleet, one
from tests.harness.redis_server import RedisServer, free_port
from tests.harness.tasks import job_control as jc
from tests.harness.tasks.worker import EFFECTS_DDL
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

PRODUCERS = 20
KEY1 = base64.b64encode(b"\x11" * 32).decode()
KEY2 = base64.b64encode(b"\x22" * 32).decode()
K1 = f"k1:{KEY1}"
K2 = f"k2:{KEY2}"
SETTINGS = {
    **LEASES,
    "POSTBOX_API_POOL_TIMEOUT": "30",
    "POSTBOX_API_MAX_LOOP_LAG": "0",
    "POSTBOX_TASKS": "tests.harness.tasks.job_control",
}


@pytest.fixture
def fleet(child_env: dict[str, str], private_redis: RedisServer, tmp_path: Path) -> Iterator[Fleet]:
    env = {**child_env, "POSTBOX_REDIS_URL": private_redis.url}
    # the handlers POSTBOX_TASKS names, the settings' retry delays, drain timeout and concurrency; whole logs
    with Fleet(env, tmp_path, settings=SETTINGS, tasks=None, queue=jc.QUEUE, concurrency=None, log_tail=None) as procs:
        yield procs


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        yield conn


@pytest.fixture
def keys() -> Iterator[None]:
    encryption.use_keys(K1)
    yield
    encryption.use_keys(None)


def race(n: int, call: Callable[[int, threading.Barrier], Any]) -> list[Any]:
    """``call(i)`` for i in 0..n-1 from n threads released at once; the answers in i order."""
    barrier = threading.Barrier(n)
    answers: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            answers[i] = call(i, barrier)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    return answers


def publish_definitions(database_url: str) -> None:
    """The tasks' definitions in postbox.tasks, as a worker publishes them at start (SQL enqueue reads them)."""

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            await definitions.publish(aconn, default_registry, "test")
            await aconn.commit()

    asyncio.run(run())


# --- debounce and throttle: twenty producers at once ------------------------------------------------------


@pytest.mark.parametrize("task", ["jc_debounced", "jc_merged", "jc_throttled"])
def test_twenty_sql_producers_at_once_leave_one_job_that_every_one_of_them_got(
    task: str, db: psycopg.Connection[Any], database_url: str
) -> None:
    """Twenty connections call postbox.enqueue() at the same instant, each in its own transaction. The SQL
    function returns the id only (no duplicate flag): who created the row is read from its xmin — for a
    throttle the creator is the one whose args it keeps; for a debounce the last writer is."""
    publish_definitions(database_url)

    def args(i: int) -> dict[str, Any]:
        if task == "jc_throttled":
            return {"user": 7, "text": f"t{i}"}
        if task == "jc_merged":
            return {"doc": "m", f"f{i}": i}
        return {"doc": "d", "version": i}

    def produce(i: int, barrier: threading.Barrier) -> tuple[int, int]:
        with psycopg.connect(database_url) as own:
            barrier.wait(60)
            with own.transaction():
                job_id = one(own, "SELECT postbox.enqueue(%s, %s::jsonb)", (task, orjson.dumps(args(i)).decode()))
                xid = one(own, "SELECT txid_current() % 4294967296")
            return job_id, xid

    answers = race(PRODUCERS, produce)
    ids = {job_id for job_id, _ in answers}
    assert len(ids) == 1
    rows = db.execute("SELECT id, task, args, state, xmin::text::bigint FROM postbox.outbox").fetchall()
    assert len(rows) == 1
    (job_id, got_task, stored, state, xmin) = rows[0]
    assert (job_id, got_task, state) == (ids.pop(), task, "pending")
    writers = [i for i, (_, xid) in enumerate(answers) if xid == xmin]
    assert len(writers) == 1  # one transaction wrote the row last
    if task == "jc_merged":  # every producer's field merged in: no update lost
        assert stored == {"doc": "m", **{f"f{i}": i for i in range(PRODUCERS)}}
    else:  # throttle: the creator's args; debounce: the last writer's
        assert stored == args(writers[0])
    due = one(db, "SELECT round(extract(epoch FROM available_at - created_at)) FROM postbox.outbox")
    assert due == {"jc_debounced": jc.DEBOUNCE_WINDOW, "jc_merged": 60, "jc_throttled": 0}[task]


def test_twenty_rest_producers_at_once_get_the_surviving_job_and_it_runs_once_despite_a_redis_flush(
    fleet: Fleet, db: psycopg.Connection[Any], private_redis: RedisServer
) -> None:
    """Twenty HTTP requests at once against `postbox api run`, for a debounced and a throttled key: one 201
    (not a duplicate), nineteen 200 duplicates, all with the same id, one row each. The relay publishes
    them when due; Redis is flushed before any worker runs; the worker runs each job once, the debounced
    one with the arguments its row holds (the last producer's)."""
    port = free_port()
    fleet.api(port)
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
        60,
        ignore=(httpx.HTTPError,),
        message=lambda: f"the API\n{fleet.logs()}",
    )

    def post(body: dict[str, Any]) -> Callable[[int, threading.Barrier], tuple[int, int, bool]]:
        def call(i: int, barrier: threading.Barrier) -> tuple[int, int, bool]:
            with httpx.Client(timeout=60) as client:
                payload = {"task": body["task"], "args": {**body["args"], **({"version": i} if "doc" in body["args"]
                                                                          else {"text": f"t{i}"})}}  # fmt: skip
                barrier.wait(60)
                response = client.post(url + "/api/v1/jobs", json=payload)
            assert response.status_code in (200, 201), response.text
            return response.status_code, response.json()["id"], response.json()["duplicate"]

        return call

    outcomes = {}
    for task, base in (("jc_debounced", {"doc": "r"}), ("jc_throttled", {"user": 9})):
        answers = race(PRODUCERS, post({"task": task, "args": base}))
        assert len({job_id for _, job_id, _ in answers}) == 1
        assert sorted((status, duplicate) for status, _, duplicate in answers) == [(200, True)] * (PRODUCERS - 1) + [
            (201, False)
        ]
        outcomes[task] = answers[0][1]
    rows = db.execute("SELECT id, task, state FROM postbox.outbox ORDER BY id").fetchall()
    assert rows == [(outcomes["jc_debounced"], "jc_debounced", "pending"), (outcomes["jc_throttled"], "jc_throttled",
                                                                             "pending")]  # fmt: skip
    # What an operator sees: the API counts the collapsed enqueues as duplicates.
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert f'postbox_api_enqueued_total{{outcome="created",queue="{jc.QUEUE}"}} 2.0' in metrics
    assert f'postbox_api_enqueued_total{{outcome="duplicate",queue="{jc.QUEUE}"}} {2.0 * (PRODUCERS - 1)}' in metrics
    last = one(db, "SELECT (args->>'version')::int FROM postbox.outbox WHERE task = 'jc_debounced'")
    first = one(db, "SELECT args->>'text' FROM postbox.outbox WHERE task = 'jc_throttled'")
    assert last in range(PRODUCERS) and first in {f"t{i}" for i in range(PRODUCERS)}

    fleet.relay()
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'queued'") == 2,
        60,
        message=lambda: f"both published (the debounced one after its window)\n{fleet.logs()}",
    )
    private_redis.client().flushall()  # both entries gone before any worker read them
    fleet.worker()
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == 2,
        90,
        message=lambda: f"both run after the flush\n{fleet.logs()}",
    )
    assert sorted(db.execute("SELECT job_id, label, attempt FROM worker_effects").fetchall()) == sorted(
        [(outcomes["jc_debounced"], f"r:v{last}", 1), (outcomes["jc_throttled"], f"9:{first}", 1)]
    )
    assert one(db, "SELECT count(*) FROM postbox.job_attempts") == 2


def test_a_debounced_job_whose_worker_is_sigkilled_mid_run_takes_no_new_args_and_runs_once(
    fleet: Fleet, db: psycopg.Connection[Any]
) -> None:
    """The job has started (claimed): an enqueue of its key while its worker lies dead starts a new job
    instead of changing the started one's args. The takeover finishes the first with its own args, the new
    one runs after its window with the newer args: two effects, one each."""
    fleet.relay()
    first_worker = fleet.worker()
    first = postbox.enqueue(db, jc.jc_debounced_slow, {"doc": "k", "version": 1, "seconds": 2.0})
    wait_until(
        lambda: one(db, "SELECT state FROM postbox.outbox WHERE id = %s", (first,)) == "running",
        60,
        message=lambda: f"the debounced job running\n{fleet.logs()}",
    )
    first_worker.kill()
    first_worker.wait(10)
    second = postbox.enqueue(db, jc.jc_debounced_slow, {"doc": "k", "version": 2, "seconds": 0.0})
    assert second != first and not second.duplicate
    assert one(db, "SELECT args->>'version' FROM postbox.outbox WHERE id = %s", (first,)) == "1"
    fleet.worker()
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == 2,
        90,
        message=lambda: f"both run\n{fleet.logs()}",
    )
    assert db.execute("SELECT job_id, label FROM worker_effects ORDER BY job_id").fetchall() == [
        (first, "k:v1"),
        (second, "k:v2"),
    ]
    attempts = db.execute("SELECT outbox_id, attempt, outcome FROM postbox.job_attempts ORDER BY 1, 2").fetchall()
    assert attempts == [(first, 1, "lost"), (first, 2, "succeeded"), (second, 1, "succeeded")]


# --- moving waiting jobs -----------------------------------------------------------------------------------


def test_published_jobs_moved_by_the_cli_run_once_through_a_redis_flush_and_a_worker_sigkill(
    fleet: Fleet, db: psycopg.Connection[Any], private_redis: RedisServer
) -> None:
    """Six jobs published (queued) at priority 5; `postbox jobs move` sends them to priority 9 (back through
    the outbox, old entries dropped); Redis is flushed; a worker is SIGKILLed in the middle of a run; a second
    worker finishes. Every job runs to success once; only the killed run has a second attempt."""
    fleet.relay()
    ids = [postbox.enqueue(db, jc.jc_slow, {"label": f"m{i}", "seconds": 1.0}) for i in range(6)]
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'queued'") == 6,
        60,
        message=lambda: f"published\n{fleet.logs()}",
    )
    moved = fleet.postbox("jobs", "move", "--queue", jc.QUEUE, "--state", "queued", "--priority", "9", "--json")
    assert moved.returncode == 0, moved.stderr
    assert sorted(job["id"] for job in orjson.loads(moved.stdout)["moved"]) == ids
    assert one(db, "SELECT count(*) FROM postbox.audit_log WHERE action = 'job.move'") == 1
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'queued' AND priority = 9") == 6,
        60,
        message=lambda: f"published again at priority 9\n{fleet.logs()}",
    )
    private_redis.client().flushall()
    first = fleet.worker(POSTBOX_CONCURRENCY="1")
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'running'") == 1,
        60,
        message=lambda: f"a run under way\n{fleet.logs()}",
    )
    first.kill()
    first.wait(10)
    fleet.worker()
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == 6,
        120,
        message=lambda: f"all run\n{fleet.logs()}",
    )
    effects = db.execute("SELECT job_id, label FROM worker_effects ORDER BY job_id").fetchall()
    assert effects == [(job_id, f"m{i}") for i, job_id in enumerate(ids)]
    assert one(db, "SELECT count(*) FROM postbox.job_attempts WHERE outcome = 'succeeded'") == 6
    assert one(db, "SELECT count(*) FROM postbox.job_attempts WHERE outcome <> 'succeeded'") <= 1  # the killed run
    assert one(db, "SELECT array_agg(DISTINCT priority) FROM postbox.outbox") == [9]
    # These workers have no encryption key, and their queue has an encrypted task: each said so at start.
    assert fleet.logs().count("encrypted tasks jc_secret, jc_secret_result cannot run here: no encryption key") == 2


# --- encrypted arguments -----------------------------------------------------------------------------------


def test_a_rotation_with_jobs_in_flight_a_worker_sigkill_and_a_redis_flush_runs_each_job_once(
    fleet: Fleet, db: psycopg.Connection[Any], private_redis: RedisServer, keys: None
) -> None:
    """Six encrypted jobs sealed under k1 run on a worker holding k1 only; it is SIGKILLed mid-run. The new
    key k2 goes first (`postbox encryption reencrypt` reseals every row while their k1 envelopes are still in
    the stream), two jobs are enqueued under k2, Redis is flushed, and a worker holding k2,k1 runs the rest.
    Each job runs to success once with its own arguments; no key and no card number appears in any log."""
    cards = [f"4111-0000-0000-{i:04d}" for i in range(8)]
    fleet.relay()
    ids = [postbox.enqueue(db, jc.jc_secret, {"card": cards[i], "n": i, "seconds": 0.8}) for i in range(6)]
    first = fleet.worker(POSTBOX_ENCRYPTION_KEYS=K1, POSTBOX_CONCURRENCY="2")
    wait_until(
        lambda: (
            one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") >= 1
            and one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'running'") >= 1
        ),
        60,
        message=lambda: f"one run done, one under way\n{fleet.logs()}",
    )
    first.kill()
    first.wait(10)
    rotated = fleet.postbox("encryption", "reencrypt", "--json", POSTBOX_ENCRYPTION_KEYS=f"{K2},{K1}")
    assert rotated.returncode == 0, rotated.stderr
    report = orjson.loads(rotated.stdout)
    assert (report["key"], report["resealed"], report["failed"]) == ("k2", 6, [])
    assert one(db, "SELECT count(*) FROM postbox.outbox WHERE args->'$postbox_encrypted'->>'kid' = 'k2'") == 6
    encryption.use_keys(f"{K2},{K1}")
    ids += [postbox.enqueue(db, jc.jc_secret, {"card": cards[i], "n": i}) for i in (6, 7)]
    private_redis.client().flushall()
    fleet.worker(POSTBOX_ENCRYPTION_KEYS=f"{K2},{K1}")
    wait_until(
        lambda: one(db, "SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'") == 8,
        120,
        message=lambda: f"all run\n{fleet.logs()}",
    )
    effects = db.execute("SELECT job_id, label FROM worker_effects ORDER BY job_id").fetchall()
    assert effects == [(job_id, f"card:{cards[i]}:{i}") for i, job_id in enumerate(ids)]
    assert one(db, "SELECT count(*) FROM postbox.job_attempts WHERE outcome = 'succeeded'") == 8
    again = fleet.postbox("encryption", "reencrypt", POSTBOX_ENCRYPTION_KEYS=K2)  # nothing left under k1
    assert (again.returncode, again.stdout.strip()) == (0, "0 rows sealed under key 'k2'")
    stored = " ".join(r[0] for r in db.execute("SELECT args::text FROM postbox.outbox").fetchall())
    logs = fleet.logs() + rotated.stdout + rotated.stderr
    for secret in (KEY1, KEY2, *cards):
        assert secret not in logs and secret not in stored
    assert "no encryption key" not in logs  # both workers had a key


@pytest.mark.parametrize("command", [("worker", "run"), ("relay", "run"), ("api", "run"), ("encryption", "reencrypt")])
def test_a_bad_key_stops_a_process_at_start_naming_the_setting_never_the_key(
    command: tuple[str, ...], fleet: Fleet
) -> None:
    bad = f"k1:{KEY1},{KEY2}"  # the second one lacks its id
    done = fleet.postbox(*command, POSTBOX_ENCRYPTION_KEYS=bad)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "invalid settings: POSTBOX_ENCRYPTION_KEYS: " in done.stderr
    assert "key #2 is not kid:base64key (no ':')" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert KEY1 not in done.stderr + done.stdout and KEY2 not in done.stderr + done.stdout
