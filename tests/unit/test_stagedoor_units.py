"""Stagedoor's pure parts: validation, ids, blob store, PDF, mail client mapping, provider fault draws."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from postbox.errors import PermanentError, SettingsError
from postbox.settings import Settings
from postbox_examples.provider.faults import AfterDelivery, Faults, seeded
from postbox_examples.settings import ExampleSettings, load_example_settings
from postbox_examples.stagedoor.blobs import BlobStore, blob_root
from postbox_examples.stagedoor.errors import InvalidEmailError, InvalidOrderError
from postbox_examples.stagedoor.mail import Attachment, MailClient, Message, ProviderError, tickets_key
from postbox_examples.stagedoor.orders import PUBLIC_ID_ALPHABET, check_event, check_order, new_public_id
from postbox_examples.stagedoor.pdf import TicketDocument, render


def test_check_order_accepts_and_refuses() -> None:
    assert check_order(3, 2, "ann@example.org") == (3, 2, "ann@example.org")
    for event_id, seats, email, error in [
        (0, 1, "a@b.io", InvalidOrderError),
        (1, 0, "a@b.io", InvalidOrderError),
        (1, 21, "a@b.io", InvalidOrderError),
        (1, 2.0, "a@b.io", InvalidOrderError),
        (1, False, "a@b.io", InvalidOrderError),
        (1, 1, "a@b", InvalidEmailError),
        (1, 1, "a b@c.io", InvalidEmailError),
        (1, 1, "x" * 250 + "@b.io", InvalidEmailError),
        (1, 1, None, InvalidEmailError),
    ]:
        with pytest.raises(error) as caught:
            check_order(event_id, seats, email)
        assert caught.value.status == 422 and caught.value.details["field"] in ("event_id", "seats", "email")


def test_check_event() -> None:
    assert check_event("  Gala ", 10) == ("Gala", 10)
    for name, capacity in [("", 1), ("x" * 201, 1), ("ok", -1), ("ok", "5"), (None, 1)]:
        with pytest.raises(InvalidOrderError):
            check_event(name, capacity)


def test_public_id_uses_unambiguous_characters() -> None:
    picks = iter("ABCDEFGHJK")
    assert new_public_id(lambda alphabet: next(picks)) == "SD-ABCDEFGHJK"
    generated = new_public_id()
    assert generated.startswith("SD-") and set(generated[3:]) <= set(PUBLIC_ID_ALPHABET)
    assert not set("01IO") & set(PUBLIC_ID_ALPHABET)


def test_blob_store_atomic_put_and_keys(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    store.put("tickets/SD-1.pdf", b"one")
    store.put("tickets/SD-1.pdf", b"two")  # the same key again: replaced, not duplicated
    assert store.get("tickets/SD-1.pdf") == b"two"
    assert store.keys() == ["tickets/SD-1.pdf"]
    assert os.listdir(tmp_path / "blobs" / "tickets") == ["SD-1.pdf"]  # no temporary file left
    for bad in ("../x", "/abs", "a//b", "a/../b", ".hidden", ""):
        with pytest.raises(ValueError):
            store.put(bad, b"")


def test_blob_store_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: Any) -> None:
    store = BlobStore(tmp_path)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        store.put("tickets/a.pdf", b"data")
    assert list((tmp_path / "tickets").iterdir()) == []


def test_blob_root_from_settings(tmp_path: Path) -> None:
    assert blob_root(ExampleSettings(blob_dir=str(tmp_path / "b"))) == tmp_path / "b"
    assert blob_root(ExampleSettings(state_dir=str(tmp_path / "s"))) == tmp_path / "s" / "blobs"


def test_the_examples_settings_are_their_own_and_read_the_same_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # postbox's Settings carry none of them; the example reads them under the same POSTBOX_ names
    # (docker-compose.yml gives both one environment).
    assert {"provider_url", "blob_dir", "state_dir", "stagedoor_claim_ttl"}.isdisjoint(Settings.model_fields)
    monkeypatch.setenv("POSTBOX_PROVIDER_URL", "http://provider:8025")
    monkeypatch.setenv("POSTBOX_STAGEDOOR_CLAIM_TTL", "7.5")
    example = load_example_settings()
    assert (example.provider_url, example.stagedoor_claim_ttl, example.provider_timeout) == (
        "http://provider:8025",
        7.5,
        5.0,
    )
    monkeypatch.setenv("POSTBOX_PROVIDER_TIMEOUT", "0")
    with pytest.raises(SettingsError, match="POSTBOX_PROVIDER_TIMEOUT: Input should be greater than 0"):
        load_example_settings()


def test_pdf_one_page_per_seat_same_bytes_every_render() -> None:
    doc = TicketDocument("SD-ABCDEFGHJK", "Fête ☃", "a@b.io", [7, 8, 9], datetime(2026, 1, 2, tzinfo=UTC))
    first, again = render(doc), render(doc)
    assert first == again
    assert first.startswith(b"%PDF-") and first.count(b"/Type /Page\n") == 3
    assert all(f"Seat {s}".encode() in first for s in (7, 8, 9))
    assert first.count(b"Order SD-ABCDEFGHJK") == 3


def mail_client(handler: Any) -> MailClient:
    return MailClient("http://provider.test", 1.0, transport=httpx.MockTransport(handler))


def test_mail_client_sends_key_and_maps_errors() -> None:
    seen: list[httpx.Request] = []
    message = Message("a@b.io", "Tickets", "hi", (Attachment("t.pdf", b"%PDF"),))

    async def scenario(status: int) -> Any:
        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(status, json={"id": "msg-1"})

        client = mail_client(handler)
        try:
            return await client.send(message, idempotency_key=tickets_key(42), request_id="r-1")
        finally:
            await client.aclose()

    assert asyncio.run(scenario(201)) == {"id": "msg-1"}
    assert seen[-1].headers["Idempotency-Key"] == "tickets-42" and seen[-1].headers["X-Request-ID"] == "r-1"
    assert b'"content_base64":"JVBERg=="' in seen[-1].content
    with pytest.raises(ProviderError):
        asyncio.run(scenario(500))
    with pytest.raises(ProviderError):
        asyncio.run(scenario(429))
    with pytest.raises(PermanentError):
        asyncio.run(scenario(409))


def test_mail_client_timeout_is_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async def scenario() -> None:
        client = mail_client(handler)
        try:
            await client.send(Message("a@b.io", "s", "t"), idempotency_key="k")
        finally:
            await client.aclose()

    with pytest.raises(ProviderError, match="timed out"):
        asyncio.run(scenario())


def test_provider_fault_draws() -> None:
    faults = Faults(fail_after_delivery=0.1, stall_after_delivery=0.2)
    assert faults.decide(lambda: 0.05) is AfterDelivery.FAIL
    assert faults.decide(lambda: 0.25) is AfterDelivery.STALL
    assert faults.decide(lambda: 0.35) is AfterDelivery.ANSWER
    assert Faults().decide(lambda: 0.0) is AfterDelivery.ANSWER
    draws_a, draws_b = seeded(5), seeded(5)
    assert [draws_a() for _ in range(5)] == [draws_b() for _ in range(5)]
    for bad in (
        {"fail_after_delivery": 1.5},
        {"stall_after_delivery": -0.1},
        {"fail_after_delivery": 0.6, "stall_after_delivery": 0.6},
    ):
        with pytest.raises(ValueError):
            Faults(**bad)
