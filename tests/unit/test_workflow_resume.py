"""What a workflow's dead letter requeued resumes, and how workflow notifications become events (no servers)."""

from __future__ import annotations

import orjson

from postbox import events
from postbox.relay.workflow_events import RESULTS_CHANNEL, WORKFLOW_CHANNEL, Pending, finished_event
from postbox.workflow import InboundEdge, resumable


def e(child: int, parent: int, state: str, on_failure: str = "cancel") -> InboundEdge:
    return InboundEdge(child=child, parent=parent, on_failure=on_failure, parent_state=state)


def test_a_chain_cancelled_by_the_requeued_job_waits_again() -> None:
    # 1 (requeued) -> 2 -> 3, and 2 -> 4: all cancelled by 1's death
    edges = [e(2, 1, "pending"), e(3, 2, "cancelled"), e(4, 2, "cancelled")]
    assert resumable(1, edges) == [2, 3, 4]


def test_a_job_another_failure_still_cancels_stays_cancelled_and_so_does_what_is_below_it() -> None:
    # 5 -> 6 <- 1 (requeued); 5 is dead too: 6 stays cancelled, and 7 below it
    edges = [e(6, 1, "pending"), e(6, 5, "dead"), e(7, 6, "cancelled")]
    assert resumable(1, edges) == []


def test_a_run_or_record_edge_from_a_failed_parent_does_not_keep_a_job_cancelled() -> None:
    edges = [e(6, 1, "pending"), e(6, 5, "dead", "run"), e(6, 8, "expired", "record")]
    assert resumable(1, edges) == [6]


def test_a_parent_cancelled_by_the_same_death_is_resumed_with_its_child() -> None:
    # diamond below the requeued job: 1 -> (2, 3) -> 4; 4 has both as parents
    edges = [e(2, 1, "pending"), e(3, 1, "pending"), e(4, 2, "cancelled"), e(4, 3, "cancelled")]
    assert resumable(1, edges) == [2, 3, 4]
    # an operator cancelled 3 itself (it is not below 1's death): 4 stays cancelled
    assert resumable(1, [e(2, 1, "pending"), e(4, 2, "cancelled"), e(4, 3, "cancelled")]) == [2]


def test_a_succeeded_or_unended_parent_never_blocks() -> None:
    assert resumable(1, [e(2, 1, "pending"), e(2, 9, "succeeded"), e(2, 10, "running")]) == [2]


def note(type_: str, schema: str = "postbox", **kw: object) -> str:
    body = {"schema": schema, "type": type_, "job_id": 7, "workflow_id": 3, "queue": "q", "task": "t", **kw}
    return orjson.dumps(body).decode()


def test_notifications_become_events_of_this_schema_only() -> None:
    pending = Pending("postbox")
    assert not pending
    pending.take(WORKFLOW_CHANNEL, note("released"), ts=1.0)
    pending.take(WORKFLOW_CHANNEL, note("cancelled"), ts=2.0)
    pending.take(WORKFLOW_CHANNEL, note("released", schema="other"))
    pending.take(WORKFLOW_CHANNEL, "not json")
    pending.take(WORKFLOW_CHANNEL, note("unknown"))
    pending.take(RESULTS_CHANNEL, "11,12,,x,13")
    pending.take("elsewhere", "14")
    assert [(x["type"], x["job_id"], x["workflow_id"], x["queue"], x["task"], x["ts"]) for x in pending.events] == [
        ("released", 7, 3, "q", "t", 1.0),
        ("cancelled", 7, 3, "q", "t", 2.0),
    ]
    assert "cause" not in pending.events[0] and pending.events[1]["cause"] == "upstream"
    assert pending.job_ids == {11, 12, 13}
    assert pending.workflow_ids == {3}  # a cascade cancel may end its workflow
    for evt in pending.events:
        assert events.decode(events.encode(evt)) == evt


def test_a_finished_workflow_event_has_no_job() -> None:
    evt = finished_event(3, "album", 5, "failed", ts=9.0)
    assert {k: evt[k] for k in ("type", "job_id", "queue", "task", "workflow_id", "name", "jobs", "status")} == {
        "type": "workflow_finished",
        "job_id": None,
        "queue": None,
        "task": None,
        "workflow_id": 3,
        "name": "album",
        "jobs": 5,
        "status": "failed",
    }
    assert "workflow_finished" in events.TERMINAL_EVENTS
