"""Lifecycle events the services announce (``enqueued``, ``cancelled``): best effort, never a dependency."""

from __future__ import annotations

import logging
from typing import Any

from postbox.events import EventType, encode, event
from postbox.streams import events_channel

log = logging.getLogger(__name__)


async def publish_event(
    redis: Any, prefix: str, type_: EventType, *, job_id: int, queue: str, task: str, attempt: int = 0
) -> None:
    """PUBLISH one lifecycle event; a Redis outage never fails the operation."""
    if redis is None:
        return
    try:
        await redis.publish(
            events_channel(prefix), encode(event(type_, job_id=job_id, queue=queue, task=task, attempt=attempt))
        )
    except Exception as exc:  # events are a view, never a dependency
        log.warning("event not published: %s", exc, extra={"outbox_id": job_id, "queue": queue, "task": task})
