"""Redis key naming: one stream per (queue, priority), all of a queue in one hash slot.

Keys (with the default prefix ``postbox``)::

    postbox:{<queue>}:p<priority>   stream of one queue and priority (0-9)
    postbox:epoch                   random token; vanishes when Redis loses data
    postbox:ready                   set of the streams that may hold undelivered entries (one server only)
    postbox:wake                    stream of wake-ups: an entry per relay write, naming its streams (one server only)

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


def wake_key(prefix: str) -> str:
    """The wake-up stream (one server): after each batch of XADDs the relay adds an entry naming the
    batch's streams (:func:`wake_entry`). A worker of more streams than one blocked XREAD should name
    (``postbox.worker.consumer.WAIT_GROUP``) blocks on this key instead. Trimmed to about
    :data:`WAKE_MAXLEN` entries."""
    return f"{prefix}:wake"


# Wake-up entries kept (approximately: MAXLEN ~), every queue's batches together. A worker asks
# for the entries after the last one it saw; one that comes back after the stream was trimmed
# past that entry (it did not wait for a while) reads every stream instead (the wake-up read
# script in postbox.worker.consumer checks that its cursor's entry is still there).
WAKE_MAXLEN = 1000


def wake_entry(streams: Iterable[tuple[str, int]]) -> list[bytes]:
    """A wake-up entry's fields for a batch's (queue, priority) pairs: each queue once, its priorities as
    digits (``b"emails", b"95"``). Queue names hold no spaces and priorities are single digits."""
    by_queue: dict[str, str] = {}
    for queue, priority in streams:
        digits = by_queue.get(queue, "")
        if str(priority) not in digits:
            by_queue[queue] = digits + str(priority)
    return [part for queue, digits in by_queue.items() for part in (queue.encode(), digits.encode())]


def parse_wake(prefix: str, fields: Sequence[bytes | str]) -> set[str]:
    """The stream keys a wake-up entry names (the flat field list of :func:`wake_entry`)."""
    named: set[str] = set()
    for queue, digits in zip(fields[::2], fields[1::2], strict=True):
        name = queue.decode() if isinstance(queue, bytes) else queue
        for digit in digits.decode() if isinstance(digits, bytes) else digits:
            named.add(stream_key(prefix, name, int(digit)))
    return named


def epoch_key(prefix: str) -> str:
    return f"{prefix}:epoch"


def written_key(prefix: str) -> str:
    """How many entries the relays wrote (one server; not on a Redis Cluster): each batch's write ends with
    an ``INCRBY`` of its size, so a failover that lost the batch lost its count too (postbox.relay.watermark)."""
    return f"{prefix}:written"


def events_channel(prefix: str) -> str:
    """Pub/sub channel carrying job lifecycle events (JSON) for the API's WebSocket."""
    return f"{prefix}:events"


def all_streams(prefix: str, queues: Iterable[str]) -> list[str]:
    return [key for queue in queues for key in queue_streams(prefix, queue)]


# --- stream entries -----------------------------------------------------------------
# An entry is a transport envelope. Its identity is ``id`` (the outbox id); the
# stream entry id means nothing. PostgreSQL decides whether a delivery runs.
#
# Two fields, three when there are headers:
#
#   m   b"<id> <attempt> <priority> <enq ms> <pub ms> <len(queue)> <queue><task>"
#   a   the arguments, JSON text
#   h   the headers, JSON text (left out when they are "{}")
#
# The numbers and names share one field because Redis's costs go by field: the
# read script turns each field of each entry into a Lua value and back, and XDEL
# scans an entry's fields to step past it. Nine fields cost Redis 12-13 us per
# job on the read and the delete, two about 7 (docs/benchmarks.md, thirteenth
# round). Entries of the nine-field envelope before it (ENTRY_FIELDS) are still
# read: a worker of this version takes what an older relay wrote.

ENTRY_FIELDS = ("id", "task", "args", "headers", "attempt", "queue", "priority", "enq", "pub")
EMPTY_HEADERS = "{}"


def entry_meta(
    job_id: int, attempt: int, priority: int, enqueued_ms: int, published_ms: int, queue: bytes, task: bytes
) -> bytes:
    """The ``m`` field: the numbers, then the queue's length, the queue and the task (either may hold spaces)."""
    return b"%d %d %d %d %d %d %b%b" % (job_id, attempt, priority, enqueued_ms, published_ms, len(queue), queue, task)


def split_meta(meta: bytes) -> tuple[int, int, int, int, int, str, str]:
    """(id, attempt, priority, enq ms, pub ms, queue, task) of an ``m`` field; ValueError if malformed."""
    job_id, attempt, priority, enq, pub, size, names = meta.split(b" ", 6)
    cut = int(size)
    if not 0 <= cut <= len(names):
        raise ValueError("malformed stream entry: queue length")
    return int(job_id), int(attempt), int(priority), int(enq), int(pub), names[:cut].decode(), names[cut:].decode()


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
) -> dict[str, str | bytes]:
    """Fields for XADD (redis-py's ``xadd``). ``args``/``headers`` are JSON text; times are epoch milliseconds.

    The relay sends the same fields pre-encoded (``postbox.resp.xadd_entry``).
    """
    fields: dict[str, str | bytes] = {
        "m": entry_meta(job_id, attempt, priority, enqueued_ms, published_ms, queue.encode(), task.encode()),
        "a": args,
    }
    if headers != EMPTY_HEADERS:
        fields["h"] = headers
    return fields


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode_entry(fields: dict[bytes, bytes] | dict[str, str]) -> dict[str, str | int]:
    """Inverse of :func:`encode_entry` (bytes or str keys; the nine-field envelope too); ValueError if malformed."""
    data = {_text(k): _text(v) for k, v in fields.items()}
    try:
        if "m" in data:
            job_id, attempt, priority, enq, pub, queue, task = split_meta(data["m"].encode())
            return {
                "id": job_id,
                "task": task,
                "args": data.get("a", "{}"),
                "headers": data.get("h", EMPTY_HEADERS),
                "attempt": attempt,
                "queue": queue,
                "priority": priority,
                "enq": enq,
                "pub": pub,
            }
        return {
            "id": int(data["id"]),
            "task": data["task"],
            "args": data.get("args", "{}"),
            "headers": data.get("headers", EMPTY_HEADERS),
            "attempt": int(data.get("attempt", 0)),
            "queue": data.get("queue", ""),
            "priority": int(data.get("priority", 5)),
            "enq": int(data.get("enq", 0)),
            "pub": int(data.get("pub", 0)),
        }
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed stream entry: {exc}") from None
