"""Job lifecycle events, published on Redis pub/sub for the API's WebSocket.

Events are a best-effort view for humans and dashboards; PostgreSQL stays the
truth. The relay emits ``published``; workers ``started``, ``progress`` (a
running job's ``ctx.progress()``, with its ``progress``: ``done``, ``total``,
``note``), ``succeeded``, ``retrying``, ``dead``, ``cancelled``, ``expired``; the API ``enqueued`` (for
its own enqueues) and ``cancelled``. The leading relay forwards what workflows do inside PostgreSQL's
triggers (``postbox.relay.workflow_events``): ``released`` (a job of a workflow stops waiting),
``cancelled`` with ``cause: "upstream"`` (cancelled by its failure policy), and ``workflow_finished``
(no ``job_id``; its ``status``). Channel: :func:`postbox.streams.events_channel`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, get_args

import orjson

EventType = Literal[
    "enqueued",
    "published",
    "started",
    "progress",
    "succeeded",
    "retrying",
    "dead",
    "cancelled",
    "expired",
    "released",
    "workflow_finished",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)
TERMINAL_EVENTS = frozenset({"succeeded", "dead", "cancelled", "expired", "workflow_finished"})


def event(
    type_: EventType,
    *,
    job_id: int | None,
    queue: str | None,
    task: str | None,
    attempt: int = 0,
    worker_id: str | None = None,
    ts: float | None = None,
    progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    evt = {
        "event_id": uuid.uuid4().hex,
        "ts": time.time() if ts is None else ts,
        "type": type_,
        "job_id": job_id,
        "queue": queue,
        "task": task,
        "attempt": attempt,
        "worker_id": worker_id,
    }
    if progress is not None:
        evt["progress"] = progress
    return evt


def encode(evt: dict[str, Any]) -> bytes:
    return orjson.dumps(evt)


def decode(raw: bytes | str) -> dict[str, Any]:
    value = orjson.loads(raw)
    if not isinstance(value, dict) or value.get("type") not in EVENT_TYPES:
        raise ValueError("not a postbox event")
    return value
