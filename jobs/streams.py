"""Redis key naming: one stream per (queue, priority), all of a queue in one hash slot.

Keys (with the default prefix ``postbox``)::

    postbox:{<queue>}:p<priority>   stream of one queue and priority (0-9)
    postbox:epoch                   random token; vanishes when Redis loses data
    postbox:ready                   set of the streams that may hold undelivered entries (one server only)

The ``{queue}`` hash tag puts every stream of one queue in one Redis Cluster
slot, so a worker's multi-stream XREADGROUP stays single-slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def by_slot(streams: Sequence[str]) -> list[list[str]]:
    """``streams`` grouped by queue (their ``{queue}`` hash tag, so by cluster slot), in order of first appearance."""
    groups: dict[str, list[str]] = {}
    for key in streams:
        groups.setdefault(queue_tag(key), []).append(key)
    return list(groups.values())


def queue_tag(key: str) -> str:
    """A stream key's ``{queue}`` hash tag (its cluster slot); the key itself when it has none."""
    return key[key.index("{") : key.index("}") + 1] if "{" in key and "}" in key else key


def ready_key(prefix: str) -> str:
    """The set of stream keys that may hold undelivered entries (one server; the read script keeps it, see
    ``postbox.worker.consumer``): the relay adds a stream with each XADD, a read removes one it finds empty."""
    return f"{prefix}:ready"


def epoch_key(prefix: str) -> str:
    return f"{prefix}:epoch"


def events_channel(prefix: str) -> str:
    """Pub/sub channel carrying job lifecycle events (JSON) for the API's WebSocket."""
    return f"{prefix}:events"


def all_streams(prefix: str, queues: Iterable[str]) -> list[str]:
    return [key for queue in queues for key in queue_streams(prefix, queue)]


# --- stream entries -----------------------------------------------------------------
# An entry is a transport envelope. Its identity is ``id`` (the outbox id); the
# stream entry id means nothing. PostgreSQL decides whether a delivery runs.

ENTRY_FIELDS = ("id", "task", "args", "headers", "attempt", "queue", "priority", "enq", "pub")


def encode_entry(
    *,
    job_id: int,
    task: str,
    args: str,
    headers: str,
    attempt: int,
    queue: str,
    priority: int,
    enqueued_ms: int,
    published_ms: int,
) -> dict[str, str | int]:
    """Fields for XADD. ``args``/``headers`` are JSON text; times are epoch milliseconds."""
    return {
        "id": job_id,
        "task": task,
        "args": args,
        "headers": headers,
        "attempt": attempt,
        "queue": queue,
        "priority": priority,
        "enq": enqueued_ms,
        "pub": published_ms,
    }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode_entry(fields: dict[bytes, bytes] | dict[str, str]) -> dict[str, str | int]:
    """Inverse of :func:`encode_entry` (accepts bytes or str keys); raises ValueError if malformed."""
    data = {_text(k): _text(v) for k, v in fields.items()}
    try:
        return {
            "id": int(data["id"]),
            "task": data["task"],
            "args": data.get("args", "{}"),
            "headers": data.get("headers", "{}"),
            "attempt": int(data.get("attempt", 0)),
            "queue": data.get("queue", ""),
            "priority": int(data.get("priority", 5)),
            "enq": int(data.get("enq", 0)),
            "pub": int(data.get("pub", 0)),
        }
    except (KeyError, ValueError) as exc:
        raise ValueError(f"malformed stream entry: {exc}") from None
