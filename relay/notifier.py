"""Wake-ups: LISTEN ``postbox_outbox`` on a connection of its own.

A NOTIFY wakes the publish loop, which selects by "unpublished": that select
decides what is published. An insert of one job that is due at once also
carries the job in its notification's payload (migration 0018): the loop sends
such jobs before it selects (:meth:`postbox.relay.publisher.Publisher.publish_notified`),
one round trip less between a job's commit and its handler at moderate rates;
the select that follows skips them as held. A payload is only a head start:
one lost, malformed, of another schema or of a job already seen is dropped,
and the select finds the job. Notifications sent while the listener is
disconnected are lost, so after every (re)LISTEN the notifier wakes the loop
once — a poll right after reconnecting — and the loop polls anyway every
``poll_interval``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import psycopg

from postbox import sql
from postbox.db import connect_async

log = logging.getLogger(__name__)

LISTENER_APPLICATION_NAME = "postbox-relay-listener"
MAX_PAYLOADS = 10_000  # kept between two turns of the publish loop; past that, a wake-up counts as bare


def notified_rows(payloads: Iterable[str], schema_name: str) -> list[tuple[Any, ...]]:
    """The jobs the payloads carry, as the relay's select returns rows; only this schema's, and only well formed.

    A payload is ``[schema, id, queue, task, args, headers, priority, attempts, enq_ms, expired]``
    (arguments and headers as JSON text), written by the outbox's trigger (migration 0018).
    """
    rows: list[tuple[Any, ...]] = []
    for payload in payloads:
        try:
            item = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if not (isinstance(item, list) and len(item) == 10 and item[0] == schema_name):
            continue
        _, job_id, queue, task, args, headers, priority, attempts, enq_ms, expired = item
        if not (
            type(job_id) is int
            and isinstance(queue, str)
            and isinstance(task, str)
            and isinstance(args, str)
            and isinstance(headers, str)
            and type(priority) is int
            and type(attempts) is int
            and type(enq_ms) is int
            and isinstance(expired, bool)
        ):
            continue
        rows.append((job_id, queue, task, args, headers, priority, attempts, enq_ms, expired))
    return rows


class Notifier:
    """Sets ``wake`` on every notification and after every (re)connect, keeps the payloads; runs until cancelled."""

    def __init__(
        self,
        url: str,
        wake: asyncio.Event,
        *,
        reconnect_delay: float = 0.2,
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        self.wake = wake
        self.reconnect_delay = reconnect_delay
        self.on_listening = on_listening
        self.backend_pid: int | None = None
        self.payloads: deque[str] = deque()
        # A wake-up since the last take() that carried no job (an empty notification, a (re)LISTEN,
        # a lost connection, payloads dropped for room): the loop must select.
        self.bare = False

    def take(self) -> tuple[list[str], bool]:
        """The payloads received since the last call (the publish loop's turn), and whether a wake-up came bare."""
        taken, bare = list(self.payloads), self.bare
        self.payloads.clear()
        self.bare = False
        return taken, bare

    async def run(self) -> None:
        delay = self.reconnect_delay
        while True:
            conn = None
            try:
                conn = await connect_async(
                    self.url, autocommit=True, application_name=LISTENER_APPLICATION_NAME, connect_timeout=5
                )
                await conn.execute(sql.active().OUTBOX_LISTEN)
                self.backend_pid = conn.info.backend_pid
                delay = self.reconnect_delay
                self.bare = True
                self.wake.set()  # poll right after every (re-)LISTEN: anything sent meanwhile is lost
                if self.on_listening is not None:
                    self.on_listening()
                async for note in conn.notifies():
                    if not note.payload:
                        self.bare = True
                    elif len(self.payloads) == MAX_PAYLOADS:  # the oldest would be dropped: select instead
                        self.bare = True
                    else:
                        self.payloads.append(note.payload)
                    self.wake.set()
            except psycopg.Error as exc:
                log.warning("listener disconnected, reconnecting", extra={"error": str(exc).strip()})
                self.bare = True
                self.wake.set()
            finally:
                self.backend_pid = None
                if conn is not None:
                    await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
