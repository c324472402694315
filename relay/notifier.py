"""Wake-ups: LISTEN ``postbox_outbox`` on a connection of its own.

A NOTIFY only wakes the publish loop; it never says what to publish (the loop
selects by "unpublished"). Notifications sent while the listener is
disconnected are lost, so after every (re)LISTEN the notifier wakes the loop
once — a poll right after reconnecting — and the loop polls anyway every
``poll_interval``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from postbox import sql
from postbox.db import connect_async

log = logging.getLogger(__name__)

LISTENER_APPLICATION_NAME = "postbox-relay-listener"


class Notifier:
    """Sets ``wake`` on every notification and after every (re)connect; runs until cancelled."""

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
                self.wake.set()  # poll right after every (re-)LISTEN: anything sent meanwhile is lost
                if self.on_listening is not None:
                    self.on_listening()
                async for _ in conn.notifies():
                    self.wake.set()
            except psycopg.Error as exc:
                log.warning("listener disconnected, reconnecting", extra={"error": str(exc).strip()})
                self.wake.set()
            finally:
                self.backend_pid = None
                if conn is not None:
                    await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
