"""The start of a long-running postbox process: valid settings, logging, an event loop.

Shared by ``relay run``, ``worker run`` and ``api run`` so each fails the same
way on bad settings (one line naming the setting, exit 2) and starts the same way.
A Redis Cluster node is refused the same way (postbox speaks to one Redis endpoint:
keys of other nodes' slots would fail with MOVED, queue by queue, mid-run).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import redis

from postbox import logs
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings

T = TypeVar("T")


def process_settings(command: str, **overrides: Any) -> Settings | None:
    """Settings with both URLs required, logging set up; ``None`` after printing why not.

    Overrides that are ``None`` (a flag not given) leave the setting as configured.
    """
    try:
        settings = load_settings(**{name: value for name, value in overrides.items() if value is not None})
        settings.require_database_url()
        refusal = cluster_refusal(settings.require_redis_url())
    except SettingsError as exc:
        print(f"postbox {command}: {exc}", file=sys.stderr)
        return None
    if refusal is not None:
        print(f"postbox {command}: {refusal}", file=sys.stderr)
        return None
    logs.setup(json=settings.log_json, level=settings.log_level)
    return settings


def cluster_refusal(redis_url: str, timeout: float = 2.0) -> str | None:
    """Why ``redis_url`` cannot be used, if it is a Redis Cluster node; ``None`` otherwise or when it is down.

    An unreachable Redis is not refused: processes start and wait for it.
    """
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        info: Any = client.info("cluster")  # typed differently across redis-py 5.3 .. 8
    except redis.RedisError:
        return None
    finally:
        client.close()
    if not info.get("cluster_enabled"):
        return None
    return (
        "POSTBOX_REDIS_URL points at a Redis Cluster node; Redis Cluster is not supported yet "
        "(use one Redis server with replicas; see docs/operations.md)"
    )


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when installed (the ``fast`` extra), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
