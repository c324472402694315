"""A stream entry as the worker sees it, and a claimed attempt of a job."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from postbox.streams import EMPTY_HEADERS, decode_entry, split_meta


@dataclass(slots=True)
class Delivery:
    """One stream entry. Its identity is ``job_id``; ``entry_id`` is transport only."""

    stream: str
    entry_id: bytes
    job_id: int
    task: str
    args: str
    headers: str
    queue: str
    priority: int
    enq_ms: int
    reclaimed: bool = False
    kwargs: dict[str, Any] | None = None  # the handler's arguments, validated (Handback.screen, worker/handback.py)
    direct: bool = False  # taken from its parking by a worker that released a slot (no stream entry: b"")
    looks: int = 0  # times a limited claim found its publish not marked yet (worker/flow.py)


def parse_entry(stream: str, entry_id: bytes, flat: list[bytes]) -> Delivery:
    """:func:`parse_delivery` of an entry as a read returns it: its fields and values, alternating.

    The envelope this version's relays write (``m``, ``a``, then ``h`` when there
    are headers, in that order) is read in place, without a dict per entry; any
    other entry goes through :func:`parse_delivery`. Raises ValueError for an entry
    that is not a postbox envelope.
    """
    size = len(flat)
    if (size == 4 or (size == 6 and flat[4] == b"h")) and flat[0] == b"m" and flat[2] == b"a":
        try:
            job_id, _attempt, priority, enq_ms, _pub, queue, task = split_meta(flat[1])
            return Delivery(
                stream,
                entry_id,
                job_id,
                task,
                flat[3].decode(),
                EMPTY_HEADERS if size == 4 else flat[5].decode(),
                queue,
                priority,
                enq_ms,
            )
        except (ValueError, AttributeError, TypeError):
            pass  # told apart below, as any other entry
    return parse_delivery(stream, entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))


def parse_delivery(stream: str, entry_id: bytes, fields: dict[bytes, bytes], *, reclaimed: bool = False) -> Delivery:
    """Raises ValueError for an entry that is not a postbox envelope.

    The hot path reads the envelope's bytes fields directly; anything else (the
    nine-field envelope of older relays, str keys) goes through
    :func:`postbox.streams.decode_entry`, the codec's own (slower, general) decoder.
    """
    try:
        job_id, _attempt, priority, enq_ms, _pub, queue, task = split_meta(fields[b"m"])
        headers = fields.get(b"h")
        return Delivery(
            stream=stream,
            entry_id=entry_id,
            job_id=job_id,
            task=task,
            args=fields[b"a"].decode(),
            headers=EMPTY_HEADERS if headers is None else headers.decode(),
            queue=queue,
            priority=priority,
            enq_ms=enq_ms,
            reclaimed=reclaimed,
        )
    except (KeyError, ValueError, AttributeError, TypeError):
        pass
    data = decode_entry(fields)
    return Delivery(
        stream=stream,
        entry_id=entry_id,
        job_id=int(data["id"]),
        task=str(data["task"]),
        args=str(data["args"]),
        headers=str(data["headers"]),
        queue=str(data["queue"]),
        priority=int(data["priority"]),
        enq_ms=int(data["enq"]),
        reclaimed=reclaimed,
    )


@dataclass(slots=True, eq=False)
class Job:
    """The attempt this worker claimed: the fence is (worker id, ``attempt``)."""

    delivery: Delivery
    attempt: int
    max_attempts: int
    timeout: float | None
    keep_result: bool
    enq_ms: int
    cancel_requested: bool = False
    isolate: bool = False  # taken over from a lost run: run it alone (a crash then is its own)
    flow_slots: bool = False  # holds concurrency slots (worker/flow.py): released after its outcome
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    id: int = field(init=False)  # the delivery's job id, read several times per run

    def __post_init__(self) -> None:
        self.id = self.delivery.job_id
