"""Redis key naming: one stream per (queue, priority), all of a queue in one hash slot.

Keys (with the default prefix ``postbox``)::

    postbox:{<queue>}:p<priority>   stream of one queue and priority (0-9)
    postbox:epoch                   random token; vanishes when Redis loses data

The ``{queue}`` hash tag puts every stream of one queue in one Redis Cluster
slot, so a worker's multi-stream XREADGROUP stays single-slot.
"""

from __future__ import annotations

from collections.abc import Iterable

GROUP = "postbox"
PRIORITIES: tuple[int, ...] = tuple(range(9, -1, -1))  # highest first


def stream_key(prefix: str, queue: str, priority: int) -> str:
    if not 0 <= priority <= 9:
        raise ValueError(f"priority out of range: {priority}")
    return f"{prefix}:{{{queue}}}:p{priority}"


def queue_streams(prefix: str, queue: str) -> list[str]:
    """The queue's streams, highest priority first."""
    return [stream_key(prefix, queue, priority) for priority in PRIORITIES]


def parse_stream_key(prefix: str, key: str) -> tuple[str, int]:
    """(queue, priority) of a stream key made by :func:`stream_key`."""
    head = f"{prefix}:{{"
    if not key.startswith(head) or "}:p" not in key:
        raise ValueError(f"not a postbox stream key: {key!r}")
    queue, _, priority = key[len(head) :].rpartition("}:p")
    return queue, int(priority)


def epoch_key(prefix: str) -> str:
    return f"{prefix}:epoch"


def events_channel(prefix: str) -> str:
    """Pub/sub channel carrying job lifecycle events (JSON) for the API's WebSocket."""
    return f"{prefix}:events"


def all_streams(prefix: str, queues: Iterable[str]) -> list[str]:
    return [key for queue in queues for key in queue_streams(prefix, queue)]
