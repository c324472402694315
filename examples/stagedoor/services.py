"""What the Stagedoor handlers use besides ``ctx``: a connection pool, the blob store, the mail client, a clock.

Built lazily on first use from :func:`postbox.settings.load_settings` and the example's own
:func:`~postbox_examples.settings.load_example_settings` (so importing the tasks module does no
I/O), once per process.  Tests build their own with
:meth:`Services.open` and :func:`install` it — with a pinned clock, for example.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from postbox.settings import Settings, load_settings
from postbox_examples.settings import ExampleSettings, load_example_settings
from postbox_examples.stagedoor.blobs import BlobStore, blob_root
from postbox_examples.stagedoor.mail import MailClient

# An unsent claim older than this may be taken over (DESIGN.md §6: two minutes);
# the example's setting POSTBOX_STAGEDOOR_CLAIM_TTL, whose default this is, can change it.
CLAIM_TTL_SECONDS = 120.0


def database_clock() -> datetime | None:
    """The production clock: ``None`` means "use the database's now()"."""
    return None


@dataclass
class Services:
    settings: Settings
    pool: AsyncConnectionPool[Any]
    blobs: BlobStore
    mail: MailClient
    now: Callable[[], datetime | None] = field(default=database_clock)
    claim_ttl: float = CLAIM_TTL_SECONDS

    @classmethod
    async def open(cls, settings: Settings, example: ExampleSettings | None = None, **overrides: Any) -> Services:
        example = example if example is not None else load_example_settings()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.require_database_url(),
            min_size=1,
            max_size=max(2, min(settings.concurrency, 8)),  # handlers hold a connection only briefly
            kwargs={"autocommit": True, "application_name": "postbox-stagedoor"},
            check=AsyncConnectionPool.check_connection,
            open=False,
        )
        await pool.open()
        overrides.setdefault("claim_ttl", example.stagedoor_claim_ttl)
        return cls(
            settings=settings,
            pool=pool,
            blobs=BlobStore(blob_root(example)),
            mail=MailClient(example.provider_url, example.provider_timeout),
            **overrides,
        )

    async def close(self) -> None:
        await self.mail.aclose()
        await self.pool.close()


_current: Services | None = None
_opening: asyncio.Lock | None = None


async def current() -> Services:
    """The process's services, opened on first use."""
    global _current, _opening
    if _current is not None:
        return _current
    if _opening is None:
        _opening = asyncio.Lock()
    async with _opening:
        if _current is None:
            _current = await Services.open(load_settings())
    return _current


def install(services: Services | None) -> Services | None:
    """Use ``services`` from now on (``None``: back to lazy defaults); returns the previous ones."""
    global _current
    previous, _current = _current, services
    return previous
