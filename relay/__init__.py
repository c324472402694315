"""The relay: publishes committed outbox rows to Redis streams, one leader at a time.

- :mod:`postbox.relay.leader` — the advisory-lock session; publishing runs on it.
- :mod:`postbox.relay.publisher` — one batch: select due rows, XADD, mark published.
- :mod:`postbox.relay.notifier` — LISTEN/NOTIFY wake-ups (polling is the fallback).
- :mod:`postbox.relay.reconciler` — Redis-loss detection and bounded republishing.
- :mod:`postbox.relay.metrics` — Prometheus metrics of a relay process.
- :mod:`postbox.relay.service` — :class:`Relay`, the service tying them together.
- :mod:`postbox.relay.watermark` — each stream's high-water mark (a Redis failover that lost entries).
- :mod:`postbox.relay.scheduler` — the leader's schedule duty (periodic jobs).
- :mod:`postbox.relay.cli` — ``postbox relay run`` / ``python -m postbox.relay run``.

Nothing here does I/O at import time.
"""

from __future__ import annotations

from postbox.relay.service import Relay, RelaySignals

__all__ = ["Relay", "RelaySignals"]

if __name__ != "postbox.relay":  # this folder imported under its own name, not as the installed package
    raise ImportError("import postbox.relay, not relay: the folder relay/ is installed as postbox.relay")
