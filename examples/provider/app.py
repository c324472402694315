"""The provider's HTTP API.

- ``POST /v1/messages`` with an ``Idempotency-Key`` header: the first request
  with a key delivers (records) the message and answers 201; every later
  request with that key gets the same answer (200) and delivers nothing.
- ``GET /v1/messages``: everything delivered, oldest first — what tests count.
- ``GET /health``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

from postbox_examples.provider import store
from postbox_examples.provider.faults import AfterDelivery, Faults, seeded

log = logging.getLogger(__name__)

MAX_KEY = 255


class AttachmentIn(BaseModel):
    filename: str = Field(min_length=1, max_length=255)
    content_type: str = Field(default="application/octet-stream", max_length=255)
    content_base64: str = ""


class MessageIn(BaseModel):
    to: str = Field(min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=998)
    text: str = Field(default="", max_length=1_000_000)
    attachments: list[AttachmentIn] = Field(default_factory=list, max_length=20)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "details": {}}}, status_code=status)


def _attachment_meta(attachments: list[AttachmentIn]) -> list[dict[str, Any]]:
    meta = []
    for item in attachments:
        try:
            content = base64.b64decode(item.content_base64, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"attachment {item.filename!r} is not valid base64") from None
        meta.append(
            {
                "filename": item.filename,
                "content_type": item.content_type,
                "size": len(content),
                "sha256": hashlib.sha256(content).hexdigest(),
            }
        )
    return meta


def create_app(database_url: str, faults: Faults | None = None, rand: Callable[[], float] | None = None) -> FastAPI:
    """The provider app on ``database_url`` (its ``provider`` schema is created on start)."""
    faults = faults or Faults()
    draw = rand or seeded(None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=5,
            kwargs={"autocommit": True, "application_name": "postbox-provider"},
            check=AsyncConnectionPool.check_connection,
            open=False,
        )
        await pool.open()
        async with pool.connection() as conn:
            await store.create_schema(conn)
        app.state.pool = pool
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="postbox example mail provider", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/messages")
    async def send_message(
        message: MessageIn,
        request: Request,
        idempotency_key: str | None = Header(default=None),
    ) -> JSONResponse:
        if not idempotency_key or len(idempotency_key) > MAX_KEY:
            return _error(400, "IDEMPOTENCY_KEY_REQUIRED", f"send an Idempotency-Key header of 1-{MAX_KEY} characters")
        try:
            meta = _attachment_meta(message.attachments)
        except ValueError as exc:
            return _error(422, "INVALID_ATTACHMENT", str(exc))
        pool: AsyncConnectionPool[Any] = request.app.state.pool
        async with pool.connection() as conn:
            delivery = await store.deliver(conn, idempotency_key, message.to, message.subject, message.text, meta)
        if delivery.request_hash != store.request_hash(message.to, message.subject):
            return _error(409, "IDEMPOTENCY_KEY_REUSED", "this key was used for another message")
        if not delivery.first:
            return JSONResponse(delivery.answer(), status_code=200)
        log.info("delivered", extra={"idempotency_key": idempotency_key})
        outcome = faults.decide(draw)
        if outcome is AfterDelivery.FAIL:
            return _error(500, "INTERNAL", "something went wrong (after delivering: --fail-after-delivery)")
        if outcome is AfterDelivery.STALL:
            await asyncio.sleep(faults.stall_seconds)
        return JSONResponse(delivery.answer(), status_code=201)

    @app.get("/v1/messages")
    async def messages(request: Request) -> list[dict[str, Any]]:
        pool: AsyncConnectionPool[Any] = request.app.state.pool
        async with pool.connection() as conn:
            return await store.list_messages(conn)

    return app
