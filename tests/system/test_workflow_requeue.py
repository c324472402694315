"""A workflow's dead letter requeued with real processes: what its death cancelled runs once after it succeeds.

A relay and a worker process run ``gate -> (step, step) -> collect``; the gate
is closed, so its job dies and its dependents are cancelled by policy. The test
opens the gate and requeues the dead letter with ``postbox dlq requeue`` (a
process too): every job then runs exactly once (one ``wf_log`` row each), and
the events channel carries what the workflow did, in order: the cascade, the
failed end, the releases after the requeue, the successful end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import redis

import postbox
from postbox import events
from postbox.settings import Settings
from postbox.streams import events_channel
from postbox.workflow import chain, group
from tests.harness.fleet import child
from tests.harness.tasks import workflow as w
from tests.harness.tasks.workflow_gate import GATE_DDL, wf_gate
from tests.harness.wait import wait_until

TASKS = "tests.harness.tasks.workflow_gate"


class Feed:
    """The workflow events of the channel, read by polling a subscription."""

    def __init__(self, settings: Settings) -> None:
        self.client = redis.Redis.from_url(str(settings.redis_url))
        self.pubsub = self.client.pubsub()
        self.pubsub.subscribe(events_channel(settings.redis_prefix))
        self.seen: list[tuple[Any, ...]] = []

    def read(self) -> list[tuple[Any, ...]]:
        while (message := self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)) is not None:
            evt = events.decode(message["data"])
            if evt["type"] == "workflow_finished":
                self.seen.append(("finished", evt["status"]))
            elif evt.get("workflow_id") is not None:
                self.seen.append((evt["type"], evt["job_id"]))
        return self.seen

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


def states(conn: psycopg.Connection[Any], ids: tuple[int, ...]) -> list[str]:
    rows = dict(conn.execute("SELECT id, state FROM postbox.outbox WHERE id = ANY(%s)", (list(ids),)).fetchall())
    conn.commit()
    return [rows[i] for i in ids]


def test_the_dependents_its_death_cancelled_run_once_after_the_requeued_job_succeeds(
    settings: Settings, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(w.LOG_DDL)
        conn.execute(GATE_DDL)
    feed = Feed(settings)
    env = {**child_env, "POSTBOX_TASKS": TASKS}
    worker = ["-m", "postbox.worker", "run", "--tasks", TASKS, "--queues", w.QUEUE]
    try:
        with (
            psycopg.connect(database_url) as conn,
            child(["-m", "postbox.relay", "run"], env, tmp_path / "relay.log"),
            child(worker, env, tmp_path / "worker.log"),
        ):
            ids = postbox.enqueue_workflow(
                conn,
                chain(
                    wf_gate.s(label="gate"),
                    group(w.wf_step.s(label="left"), w.wf_step.s(label="right")),
                    w.wf_collect.s(label="collect"),
                ),
                name="gated",
            )
            conn.commit()
            gate, left, right, collect = ids.jobs
            ended = ["dead", "cancelled", "cancelled", "cancelled"]
            wait_until(lambda: states(conn, ids.jobs) == ended, 60, message=lambda: states(conn, ids.jobs))
            cascade = [("cancelled", left), ("cancelled", right), ("cancelled", collect), ("finished", "failed")]
            wait_until(lambda: sorted(feed.read()[:3]) + feed.seen[3:] == cascade, 60, message=lambda: feed.seen)

            conn.execute("INSERT INTO wf_gate VALUES ('gate')")
            conn.commit()
            requeue = subprocess.run(
                [sys.executable, "-m", "postbox.app", "dlq", "requeue", str(gate)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert requeue.returncode == 0, requeue.stderr
            assert f"3 job(s) of its workflow wait for it again: [{left}, {right}, {collect}]" in requeue.stdout

            done = ["succeeded"] * 4
            wait_until(lambda: states(conn, ids.jobs) == done, 60, message=lambda: states(conn, ids.jobs))
            after = [("released", left), ("released", right), ("released", collect), ("finished", "succeeded")]
            wait_until(lambda: sorted(feed.read()[4:6]) + feed.seen[6:] == after, 60, message=lambda: feed.seen[4:])
            runs = conn.execute("SELECT label, attempt, upstream FROM wf_log ORDER BY label").fetchall()
            conn.commit()
    finally:
        feed.close()
    assert [(label, attempt) for label, attempt, _ in runs] == [
        ("collect", 1), ("gate", 1), ("left", 1), ("right", 1)
    ]  # fmt: skip
    assert runs[0][2]["states"] == ["succeeded", "succeeded"]
    assert runs[0][2]["steps"] == ["left", "right"]
    assert len(feed.seen) == 8, feed.seen
