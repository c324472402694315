"""Peer adapters by name (imported on demand: a missing peer package fails only its own run)."""

from __future__ import annotations

import importlib
from types import ModuleType

PEERS = ("pgqueuer", "procrastinate", "arq", "saq")


def adapter(name: str) -> ModuleType:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; one of {', '.join(PEERS)}")
    return importlib.import_module(f"postbox_bench.peers.{name}_peer")
