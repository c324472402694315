"""Pure pieces of the relay: the RESP encoder and the republish rate limiter (no servers)."""

from __future__ import annotations

import pytest
from redis.connection import Connection

from postbox import resp
from postbox.relay.reconciler import RateLimiter
from postbox.streams import encode_entry


def packed(*args: object) -> bytes:
    return b"".join(Connection().pack_command(*args))  # type: ignore[arg-type]


@pytest.mark.parametrize("headers", ["{}", '{"traceparent": "00-ab-cd-01"}'])
def test_xadd_entry_is_byte_for_byte_what_redis_py_sends(headers: str) -> None:
    fields = encode_entry(
        job_id=42,
        task="stagedoor.send_tickets",
        args='{"order_id": 7, "name": "Zoë"}',
        headers=headers,
        attempt=3,
        queue="mail",
        priority=9,
        enqueued_ms=1_795_963_847_407,
        published_ms=1_795_963_847_499,
    )
    assert len(fields) == (2 if headers == "{}" else 3)  # the headers' field only when there are any
    ours = resp.xadd_entry(
        b"postbox:{mail}:p9",
        job_id=42,
        task=b"stagedoor.send_tickets",
        args='{"order_id": 7, "name": "Zoë"}'.encode(),
        headers=headers.encode(),
        attempt=3,
        queue=b"mail",
        priority=9,
        enqueued_ms=1_795_963_847_407,
        published_ms=1_795_963_847_499,
    )
    flat = [part for item in fields.items() for part in item]
    assert ours == packed("XADD", "postbox:{mail}:p9", "*", *flat)


def test_generic_xadd_and_publish_match_redis_py() -> None:
    assert resp.xadd(b"k", [(b"a", b"1"), (b"b", b"")]) == packed("XADD", "k", "*", "a", "1", "b", "")
    assert resp.publish(b"chan", b'{"x":1}') == packed("PUBLISH", "chan", '{"x":1}')
    assert resp.command(b"GET", b"k") == packed("GET", "k")


def test_a_command_packed_in_two_parts_is_the_command_packed_at_once() -> None:
    keys = [b"postbox:{q%d}:p9" % i for i in range(12)]
    head = resp.command_head(b"EVALSHA", b"abc", b"12", *keys, b"group", b"")
    for count in (b"1", b"50", b"1000"):
        assert resp.with_tail(head, count) == packed(
            "EVALSHA", "abc", "12", *map(bytes.decode, keys), "group", "", count.decode()
        )
    assert resp.with_tail(head) == resp.command(b"EVALSHA", b"abc", b"12", *keys, b"group", b"")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_grants_a_burst_then_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=10, burst=5, clock=clock)
    assert limiter.take(100) == 5
    assert limiter.take(1) == 0
    assert abs(limiter.wait_time() - 0.1) < 1e-9
    clock.now += 0.5
    assert limiter.take(100) == 5
    clock.now += 10  # idle time never banks more than the burst
    assert limiter.take(100) == 5
    clock.now += 0.25
    assert limiter.take(1) == 1
    assert limiter.take(1) == 1
    assert limiter.take(1) == 0
