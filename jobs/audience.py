"""Whether anyone listens on a pub/sub channel, asked of Redis at most once an interval.

Lifecycle events are a view: a process sends them only while the events
channel has subscribers, so a deployment nobody watches pays no Redis command
per job or per request for them. :class:`Audience` keeps the answer of the last
``PUBSUB NUMSUB`` (:func:`postbox.redis_conn.subscribers`, every primary on a
cluster) for ``interval`` seconds: a subscriber that arrives is seen within
that interval. A process that knows of a local subscriber (the API's event hub
with a WebSocket client) says so through ``local``, which is asked first and
costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from postbox import redis_conn

CHECK_INTERVAL = 1.0  # seconds an answer of PUBSUB NUMSUB is kept


def nobody_local() -> bool:
    return False


class Audience:
    """The subscribers of one channel, as last counted (no I/O until :meth:`present` is awaited)."""

    def __init__(
        self,
        redis: redis_conn.AnyRedis,
        channel: str,
        *,
        interval: float = CHECK_INTERVAL,
        local: Callable[[], bool] = nobody_local,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.channel = channel
        self.interval = interval
        self.local = local
        self.monotonic = monotonic
        self.present_at_check = True  # until a check says otherwise
        self.checked_at: float | None = None

    def known(self) -> bool | None:
        """The answer without I/O: True with a local subscriber, the last count while fresh, else None."""
        if self.local():
            return True
        if self.checked_at is not None and self.monotonic() - self.checked_at < self.interval:
            return self.present_at_check
        return None

    async def present(self) -> bool:
        """True while a local subscriber exists or the last count (at most ``interval`` old) found one.

        The count is refreshed by the first call after ``interval``; calls meanwhile
        get the last answer without waiting. A failed count raises (the caller decides
        what an unknown audience means, and how long to wait before the next call).
        """
        answer = self.known()
        if answer is not None:
            return answer
        self.checked_at = self.monotonic()
        try:
            self.present_at_check = await redis_conn.subscribers(self.redis, self.channel) > 0
        except BaseException:
            self.checked_at = None  # unknown: the next call asks again
            raise
        return self.present_at_check
