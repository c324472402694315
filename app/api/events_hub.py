"""Fan-out of job lifecycle events from Redis pub/sub to WebSocket clients.

One subscriber per API process reads ``events_channel(prefix)`` and hands
each event to every client's :class:`ClientBuffer`. A buffer holds at most
``cap`` events; when a slow client's buffer is full, the oldest non-terminal
event is dropped to make room, and only when every buffered event is terminal
(nothing left that may be lost) is the client marked overflowed and
disconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from postbox.audience import Audience
from postbox.cancellation import cancel_all
from postbox.events import TERMINAL_EVENTS, EventType, decode, encode, event
from postbox.redis_conn import is_cluster
from postbox.streams import events_channel

log = logging.getLogger(__name__)

BUFFER_CAP = 1000
Filter = Callable[[dict[str, Any]], bool]


class ClientBuffer:
    """A bounded queue of events for one client (pure logic; no I/O)."""

    def __init__(self, cap: int = BUFFER_CAP, accept: Filter | None = None) -> None:
        self.cap = cap
        self.accept = accept
        self.items: deque[dict[str, Any]] = deque()
        self.dropped = 0
        self.overflowed = False
        self.ready = asyncio.Event()

    def push(self, evt: dict[str, Any]) -> None:
        if self.overflowed or (self.accept is not None and not self.accept(evt)):
            return
        if len(self.items) >= self.cap:
            victim = next((i for i, e in enumerate(self.items) if e.get("type") not in TERMINAL_EVENTS), None)
            if victim is not None:
                del self.items[victim]
                self.dropped += 1
            elif evt.get("type") not in TERMINAL_EVENTS:
                self.dropped += 1  # the newcomer is the only non-terminal one: it goes
                return
            else:
                self.overflowed = True  # nothing left to drop: disconnect
                self.ready.set()
                return
        self.items.append(evt)
        self.ready.set()

    async def next(self) -> dict[str, Any] | None:
        """The next event; None once the client overflowed."""
        while not self.items:
            if self.overflowed:
                return None
            self.ready.clear()
            await self.ready.wait()
        if self.overflowed:
            return None
        return self.items.popleft()


class EventHub:
    """One Redis subscription shared by every client of this process."""

    def __init__(self, redis_factory: Callable[[], Any], prefix: str) -> None:
        self._redis_factory = redis_factory
        self.channel = events_channel(prefix)
        self.clients: set[ClientBuffer] = set()
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def add(self, client: ClientBuffer, wait: float = 3.0) -> None:
        """Register a client; returns once the subscription is live (TimeoutError if Redis is unreachable)."""
        self.clients.add(client)
        if self._task is None or self._task.done():
            self._subscribed = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name="postbox-events")
        try:
            await asyncio.wait_for(self._subscribed.wait(), wait)
        except TimeoutError:
            self.clients.discard(client)
            raise

    def remove(self, client: ClientBuffer) -> None:
        self.clients.discard(client)

    def has_clients(self) -> bool:
        """Whether a client of this process listens (its events must be published)."""
        return bool(self.clients)

    def dispatch(self, evt: dict[str, Any]) -> None:
        for client in list(self.clients):
            client.push(evt)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])  # its Redis reads can lose one cancel
            self._task = None

    async def _run(self) -> None:
        delay = 0.2
        while True:
            client = self._redis_factory()
            pubsub = client.pubsub()
            try:
                if is_cluster(client):
                    await client.initialize()  # the slot map: the subscription goes to the channel's primary
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=False, timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._subscribed.set()
                        delay = 0.2
                        continue
                    if message["type"] != "message":
                        continue
                    try:
                        evt = decode(message["data"])
                    except ValueError:
                        continue
                    self.dispatch(evt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._subscribed.clear()
                if not self.clients:
                    return  # nobody listens: the next client starts a new subscription
                log.warning("event subscription lost: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()


class EventPublisher:
    """PUBLISHes the API's own events (enqueued, cancelled), never slowing a request for long.

    With an ``audience`` (:class:`postbox.audience.Audience`), events are sent only
    while someone subscribes to the events channel: a WebSocket client of this
    process at once, another subscriber within the audience's interval (a second),
    as the relay and the workers do. Without one, every event is sent.

    Each publish (and each count of the audience) gives up after ``timeout``; after
    a failure, publishing pauses for ``mute`` seconds, so a Redis outage costs one
    short wait, not one per request.
    """

    def __init__(
        self,
        redis: Any,
        prefix: str,
        *,
        timeout: float = 0.5,
        mute: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        audience: Audience | None = None,
    ) -> None:
        self.redis = redis
        self.channel = events_channel(prefix)
        self.timeout = timeout
        self.mute = mute
        self.clock = clock
        self.audience = audience
        self.muted_until = 0.0

    async def wanted(self) -> bool:
        """Whether an event published now would be sent: not muted, and someone listens (or no audience kept)."""
        if self.clock() < self.muted_until:
            return False
        if self.audience is None:
            return True
        known = self.audience.known()  # the usual case: no I/O, no timer
        if known is not None:
            return known
        try:
            async with asyncio.timeout(self.timeout):
                return await self.audience.present()
        except Exception as exc:  # unknown audience: as a failed publish
            self._muted(exc)
            return False

    async def publish(self, type_: EventType, *, job_id: int, queue: str, task: str, attempt: int = 0) -> bool:
        """True when the event was sent; False when muted, nobody listens, or Redis failed."""
        if not await self.wanted():
            return False
        try:
            async with asyncio.timeout(self.timeout):
                await self.redis.publish(
                    self.channel, encode(event(type_, job_id=job_id, queue=queue, task=task, attempt=attempt))
                )
        except Exception as exc:  # events are a view, never a dependency
            self._muted(exc)
            return False
        return True

    def _muted(self, exc: BaseException) -> None:
        self.muted_until = self.clock() + self.mute
        log.warning("events muted for %.0fs: %s", self.mute, type(exc).__name__)
