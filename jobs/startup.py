"""The start of a long-running postbox process: valid settings, logging, an event loop.

Shared by ``relay run``, ``worker run`` and ``api run`` so each fails the same
way on bad settings (one line naming the setting, exit 2) and starts the same way.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

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
        settings.require_redis_url()
    except SettingsError as exc:
        print(f"postbox {command}: {exc}", file=sys.stderr)
        return None
    logs.setup(json=settings.log_json, level=settings.log_level)
    return settings


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when installed (the ``fast`` extra), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
