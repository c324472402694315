"""The start of a long-running postbox process: valid settings, logging, an event loop.

Shared by ``relay run``, ``worker run`` and ``api run`` so each fails the same
way on bad settings (one line naming the setting, exit 2) and starts the same way.
A Redis Cluster node without ``POSTBOX_REDIS_CLUSTER`` is refused the same way
(a plain client would fail with MOVED, queue by queue, mid-run), and so are the
setting on a server that is not a cluster node.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from postbox import logs
from postbox.errors import SettingsError
from postbox.redis_conn import cluster_mode, seed_urls
from postbox.settings import Settings, load_settings

T = TypeVar("T")


def process_settings(command: str, **overrides: Any) -> Settings | None:
    """Settings with both URLs required, logging set up; ``None`` after printing why not.

    Overrides that are ``None`` (a flag not given) leave the setting as configured.
    """
    try:
        settings = load_settings(**{name: value for name, value in overrides.items() if value is not None})
        settings.require_database_url()
        refusal = cluster_refusal(settings.require_redis_url(), cluster=settings.redis_cluster)
    except SettingsError as exc:
        print(f"postbox {command}: {exc}", file=sys.stderr)
        return None
    if refusal is not None:
        print(f"postbox {command}: {refusal}", file=sys.stderr)
        return None
    logs.setup(json=settings.log_json, level=settings.log_level)
    return settings


def cluster_refusal(redis_url: str, *, cluster: bool = False, timeout: float = 2.0) -> str | None:
    """Why ``redis_url`` cannot be used as configured; ``None`` when it can, or when it is down.

    ``cluster`` is ``POSTBOX_REDIS_CLUSTER``: it must match what the server is.
    An unreachable Redis is not refused: processes start and wait for it.
    """
    if not cluster and len(seed_urls(redis_url)) > 1:
        return "POSTBOX_REDIS_URL: several URLs need POSTBOX_REDIS_CLUSTER=true"
    found = cluster_mode(redis_url, timeout)
    if found is None or found == cluster:
        return None
    if found:
        return (
            "POSTBOX_REDIS_URL points at a Redis Cluster node: set POSTBOX_REDIS_CLUSTER=true "
            "to use the cluster (see docs/operations.md, Redis Cluster)"
        )
    return "POSTBOX_REDIS_CLUSTER is set but POSTBOX_REDIS_URL is not a Redis Cluster node (cluster_enabled:0)"


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when installed (the ``fast`` extra), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
