"""RESP encoding of the hot-path Redis commands, and sending a batch of them.

The relay's XADD and the worker's XACK, XDEL and PUBLISH go through here.

redis-py's generic command packing costs ~27-50 µs per XADD of nine fields (the entry then), more
than everything else the relay does per row. Commands of any shape are packed by
hiredis (``hiredis.pack_command``, C; hiredis is already a dependency for the
reply parser): ~0.9 µs for an XACK here against 1.9 µs for the hand-written
encoder it replaced. The relay's XADD has one fixed shape, and one ``%``-format
of a prebuilt template (:func:`xadd_entry`) stays faster than hiredis for it
(1.5 µs against 2.7 µs with integer fields; docs/benchmarks.md, "RESP packing").
Each batch is written as one buffer on a pooled connection, then one reply per
command is read. Replies that are errors come back as exception instances, in
order; a broken connection is dropped and raises
:class:`redis.exceptions.ConnectionError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from postbox.streams import entry_meta


def command(*parts: bytes) -> bytes:
    """One command, packed by hiredis."""
    # hiredis's stub types the argument as a one-element tuple; any number of parts is packed.
    packed: bytes = hiredis.pack_command(parts)  # type: ignore[arg-type]
    return packed


def command_head(*parts: bytes) -> tuple[int, bytes]:
    """The first ``parts`` of a command sent often with the same start, packed once (see :func:`with_tail`)."""
    packed = command(*parts)
    return len(parts), packed[packed.index(b"\r\n") + 2 :]


def with_tail(head: tuple[int, bytes], *tail: bytes) -> bytes:
    """The command ``head`` starts, ending with ``tail``: the same bytes as :func:`command` of all the parts."""
    count, body = head
    return b"*%d\r\n" % (count + len(tail)) + body + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in tail)


def xadd(key: bytes, fields: Sequence[tuple[bytes, bytes]]) -> bytes:
    """``XADD key * f1 v1 f2 v2 ...`` (auto id, no MAXLEN: the relay never trims)."""
    return command(b"XADD", key, b"*", *(part for field in fields for part in field))


# XADD <key> * m <meta> a <args> [h <headers>]: the envelope of postbox.streams.encode_entry.
_ENTRY = b"*7\r\n$4\r\nXADD\r\n$%d\r\n%b\r\n$1\r\n*\r\n$1\r\nm\r\n$%d\r\n%b\r\n$1\r\na\r\n$%d\r\n%b\r\n"
_ENTRY_HEADERS = b"*9" + _ENTRY[2:] + b"$1\r\nh\r\n$%d\r\n%b\r\n"
_NO_HEADERS = b"{}"


def xadd_entry(
    key: bytes,
    *,
    job_id: int,
    task: bytes,
    args: bytes,
    headers: bytes,
    attempt: int,
    queue: bytes,
    priority: int,
    enqueued_ms: int,
    published_ms: int,
) -> bytes:
    """``XADD key *`` with the fields of :func:`postbox.streams.encode_entry`, in one format operation."""
    meta = entry_meta(job_id, attempt, priority, enqueued_ms, published_ms, queue, task)
    if headers == _NO_HEADERS:
        return _ENTRY % (len(key), key, len(meta), meta, len(args), args)
    return _ENTRY_HEADERS % (len(key), key, len(meta), meta, len(args), args, len(headers), headers)


def publish(channel: bytes, message: bytes) -> bytes:
    return command(b"PUBLISH", channel, message)


class ReplyTimeout(RedisTimeoutError, TimeoutError):
    """No reply within an exchange's deadline: redis-py's ``TimeoutError`` (a ``RedisError``, what its own
    commands raise, and what the relay and the worker treat as Redis unavailable) and Python's (what
    ``asyncio.timeout`` raises)."""


async def send_batch(redis: Redis, payload: bytes, replies: int) -> list[Any]:
    """Write ``payload`` (``replies`` encoded commands) and read every reply, in order.

    Error replies are returned as :class:`ResponseError` instances; any other
    failure drops the connection (its replies would be out of step) and raises.
    """
    if replies == 0:
        return []
    pool = redis.connection_pool
    conn = await take_connection(redis)
    try:
        return await exchange(conn, payload, replies)
    finally:
        await pool.release(conn)


async def take_connection(redis: Redis) -> Connection:
    """A connection from ``redis``'s pool; the caller gives it back (``redis.connection_pool.release``)."""
    pool = redis.connection_pool
    try:
        conn = await pool.get_connection()
    except TypeError:  # redis-py < 5.3 requires a command name (5.3+ deprecates it)
        conn = await pool.get_connection("XADD")  # type: ignore[call-arg,unused-ignore]
    return cast(Connection, conn)


async def exchange(conn: Connection, payload: bytes, replies: int, *, blocks: float = 0.0) -> list[Any]:
    """Write ``payload`` on ``conn``, read ``replies`` replies (errors as instances); drop ``conn`` on failure.

    The caller owns ``conn`` (takes it from its pool and gives it back). A
    command of ``payload`` that blocks on the server for up to ``blocks``
    seconds extends the connection's timeout by that much. No reply within
    the timeout raises :class:`ReplyTimeout`.
    """
    timeout = conn.socket_timeout
    limit = None if timeout is None else timeout + blocks
    try:
        await conn.send_packed_command(payload, check_health=False)
        results: list[Any] = []
        # One deadline for the whole batch. redis-py wraps each read in its own
        # asyncio.timeout when the connection has a socket timeout, which was a
        # third of the relay's CPU; without one it reads straight from the parser.
        conn.socket_timeout = None
        try:
            async with asyncio.timeout(limit):
                for _ in range(replies):
                    try:
                        results.append(await conn.read_response())
                    except ResponseError as exc:
                        results.append(exc)
        except TimeoutError as exc:  # this deadline's own (an outer one arrives as a cancellation)
            raise ReplyTimeout(f"no reply from Redis within {limit} s") from exc
        return results
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        conn.socket_timeout = timeout  # as it was: a blocking exchange extends this one only
