"""Fixtures the worker's integration tests share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from postbox.relay import Relay
from postbox.settings import Settings
from tests.harness.tasks import worker as t
from tests.harness.worker import worker_settings


@pytest.fixture
async def effects(aconn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    """The test database with the worker tasks' effect tables."""
    await aconn.execute(t.EFFECTS_DDL)
    await aconn.commit()
    return aconn


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(settings)


@pytest.fixture
async def relay(wsettings: Settings) -> AsyncIterator[Relay]:
    """The real relay, in this event loop (retries go back through it)."""
    instance = Relay(wsettings)
    task = asyncio.create_task(instance.run())
    try:
        yield instance
    finally:
        instance.stop()
        await asyncio.wait_for(task, 10)
