"""Wrong keys throttled per client: a token bucket of tries, in memory, per API process.

Each client (its address: ``request.client``, which is the forwarded address
only behind a proxy named in ``POSTBOX_API_TRUSTED_PROXIES``) starts with
``burst`` tries. A wrong key (``X-API-Key``, a dashboard login, the events
WebSocket's key) takes one; one comes back every ``refill`` seconds, up to
``burst``. A client with no try left is refused every attempt *with a key*,
right or wrong, with 429 and ``Retry-After`` (the seconds until its next try);
requests without a key are not affected. A right key does not give tries back
(a client sharing an address with a busy dashboard could otherwise guess
without end).

Memory is bounded: a client whose bucket is full again is forgotten, and past
``max_clients`` the least recently seen one is dropped. The clock is a
parameter (tests pin it).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_CLIENTS = 10_000


@dataclass
class _Bucket:
    tokens: float
    at: float


class AuthThrottle:
    def __init__(
        self,
        burst: int,
        refill: float,
        *,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill = refill
        self.max_clients = max_clients
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _current(self, client: str) -> _Bucket | None:
        bucket = self._buckets.get(client)
        if bucket is None:
            return None
        now = self.clock()
        bucket.tokens = min(float(self.burst), bucket.tokens + max(0.0, now - bucket.at) / self.refill)
        bucket.at = now
        if bucket.tokens >= self.burst:
            del self._buckets[client]  # full again: nothing to remember
            return None
        self._buckets.move_to_end(client)
        return bucket

    def retry_after(self, client: str) -> int:
        """0 when ``client`` may try a key now; else the whole seconds until its next try."""
        bucket = self._current(client)
        if bucket is None or bucket.tokens >= 1.0:
            return 0
        return max(1, math.ceil((1.0 - bucket.tokens) * self.refill))

    def failed(self, client: str) -> bool:
        """Count a wrong key; True when it took the client's last try (it is throttled from now)."""
        bucket = self._current(client)
        if bucket is None:
            bucket = _Bucket(float(self.burst), self.clock())
            self._buckets[client] = bucket
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        bucket.tokens = max(0.0, bucket.tokens - 1.0)
        return bucket.tokens < 1.0
