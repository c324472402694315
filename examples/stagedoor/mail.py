"""The mail provider's client: one POST per message, with an idempotency key on every attempt.

The key is derived from the effect (``tickets-<order_id>``), never from the
attempt, so a send that happened but was never recorded on our side is
answered from the provider's memory instead of being delivered again.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from postbox.errors import PermanentError


class ProviderError(Exception):
    """The provider failed or did not answer in time: retryable (the key makes the retry safe)."""


@dataclass(frozen=True)
class Attachment:
    filename: str
    content: bytes
    content_type: str = "application/pdf"


@dataclass(frozen=True)
class Message:
    to: str
    subject: str
    text: str
    attachments: Sequence[Attachment] = field(default_factory=tuple)

    def payload(self) -> dict[str, Any]:
        return {
            "to": self.to,
            "subject": self.subject,
            "text": self.text,
            "attachments": [
                {
                    "filename": a.filename,
                    "content_type": a.content_type,
                    "content_base64": base64.b64encode(a.content).decode(),
                }
                for a in self.attachments
            ],
        }


def tickets_key(order_id: int) -> str:
    return f"tickets-{order_id}"


class MailClient:
    """Talks to ``POST {base_url}/v1/messages``; build one per process, close it at the end."""

    def __init__(self, base_url: str, timeout: float, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout, transport=transport)

    async def send(self, message: Message, *, idempotency_key: str, request_id: str | None = None) -> dict[str, Any]:
        """Send once per key; returns the provider's answer (``id``, ``delivered_at``...)."""
        headers = {"Idempotency-Key": idempotency_key}
        if request_id:
            headers["X-Request-ID"] = request_id
        try:
            response = await self._client.post("/v1/messages", json=message.payload(), headers=headers)
        except httpx.TimeoutException as exc:
            raise ProviderError(f"provider timed out: {type(exc).__name__}") from exc
        except httpx.HTTPError as exc:
            raise ProviderError(f"provider unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise ProviderError(f"provider answered {response.status_code}")
        if response.status_code >= 400:
            # Our request is wrong (bad address, key reused for another message): retrying cannot help.
            raise PermanentError(f"provider refused the message: {response.status_code} {response.text[:200]}")
        answer: dict[str, Any] = response.json()
        return answer

    async def aclose(self) -> None:
        await self._client.aclose()
