"""The example mail provider, as a real process: idempotency keys, concurrency, misbehaviour flags."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness.provider import ProviderProcess

MESSAGE = {"to": "ann@example.org", "subject": "Your tickets", "text": "hello", "attachments": []}


@pytest.fixture
def start_provider(database_url: str) -> Iterator[Any]:
    started: list[ProviderProcess] = []

    def start(*args: str) -> ProviderProcess:
        provider = ProviderProcess(database_url, args)
        started.append(provider)
        return provider.start()

    yield start
    for provider in started:
        provider.stop()


def test_first_request_delivers_later_ones_replay(start_provider: Any) -> None:
    provider = start_provider()
    first = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "k-1"})
    again = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "k-1"})
    other = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "k-2"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json() == first.json()
    assert other.json()["id"] != first.json()["id"]
    messages = provider.messages()
    assert [(m["idempotency_key"], m["to"], m["subject"], m["replays"]) for m in messages] == [
        ("k-1", "ann@example.org", "Your tickets", 1),
        ("k-2", "ann@example.org", "Your tickets", 0),
    ]
    assert all(m["delivered_at"] for m in messages)


def test_bad_requests_deliver_nothing(start_provider: Any) -> None:
    provider = start_provider()
    no_key = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE)
    assert no_key.status_code == 400 and no_key.json()["error"]["code"] == "IDEMPOTENCY_KEY_REQUIRED"
    bad_to = httpx.post(f"{provider.url}/v1/messages", json={**MESSAGE, "to": "x"}, headers={"Idempotency-Key": "a"})
    assert bad_to.status_code == 422
    bad_b64 = httpx.post(
        f"{provider.url}/v1/messages",
        json={**MESSAGE, "attachments": [{"filename": "t.pdf", "content_base64": "!!"}]},
        headers={"Idempotency-Key": "b"},
    )
    assert bad_b64.status_code == 422
    assert provider.messages() == []
    httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "c"})
    reused = httpx.post(
        f"{provider.url}/v1/messages", json={**MESSAGE, "subject": "another"}, headers={"Idempotency-Key": "c"}
    )
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert [m["subject"] for m in provider.messages()] == ["Your tickets"]


async def test_concurrent_first_requests_deliver_once(start_provider: Any) -> None:
    provider = start_provider()
    async with httpx.AsyncClient(base_url=provider.url, timeout=20) as client:
        answers = await asyncio.gather(
            *(
                client.post("/v1/messages", json=MESSAGE, headers={"Idempotency-Key": f"same-{n % 2}"})
                for n in range(40)
            )
        )
    by_key: dict[str, list[httpx.Response]] = {"same-0": answers[0::2], "same-1": answers[1::2]}
    for responses in by_key.values():
        assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
        assert len({r.json()["id"] for r in responses}) == 1
    messages = provider.messages()
    assert sorted((m["idempotency_key"], m["replays"]) for m in messages) == [("same-0", 19), ("same-1", 19)]


def test_fail_after_delivery_delivers_then_answers_500(start_provider: Any) -> None:
    provider = start_provider("--fail-after-delivery", "1.0", "--seed", "7")
    failed = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "f"})
    assert failed.status_code == 500
    assert [m["idempotency_key"] for m in provider.messages()] == ["f"]  # it went out anyway
    retried = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "f"})
    assert retried.status_code == 200 and retried.json()["idempotency_key"] == "f"
    assert [(m["idempotency_key"], m["replays"]) for m in provider.messages()] == [("f", 1)]


def test_stall_after_delivery_outlasts_the_client_timeout(start_provider: Any) -> None:
    provider = start_provider("--stall-after-delivery", "1.0", "--stall-seconds", "2")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "s"}, timeout=0.5)
    assert [m["idempotency_key"] for m in provider.messages()] == ["s"]
    retried = httpx.post(f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": "s"}, timeout=5)
    assert retried.status_code == 200
    assert len(provider.messages()) == 1


def test_misbehaviour_probability_is_seeded(start_provider: Any) -> None:
    def statuses(prefix: str) -> list[int]:
        provider = start_provider("--fail-after-delivery", "0.5", "--seed", "42")
        codes = [
            httpx.post(
                f"{provider.url}/v1/messages", json=MESSAGE, headers={"Idempotency-Key": f"{prefix}-{n}"}
            ).status_code
            for n in range(20)
        ]
        provider.stop()
        return codes

    first = statuses("p")
    assert set(first) == {201, 500}
    assert statuses("q") == first  # same seed, same draws
    keys = [m["idempotency_key"] for m in start_provider().messages()]
    assert len(keys) == 40  # every request delivered, whatever it answered
