"""postbox.audience.Audience and the API's EventPublisher with one: events only while someone listens."""

from __future__ import annotations

from typing import Any

from postbox.app.api.events_hub import EventPublisher
from postbox.audience import Audience


class _Counted:
    """A Redis stand-in: PUBSUB NUMSUB answers ``listeners``; PUBLISH records."""

    def __init__(self, listeners: int = 0) -> None:
        self.listeners = listeners
        self.numsub_calls = 0
        self.sent: list[tuple[str, bytes]] = []

    async def pubsub_numsub(self, channel: str) -> list[tuple[bytes, int]]:
        self.numsub_calls += 1
        return [(channel.encode(), self.listeners)]

    async def publish(self, channel: str, data: bytes) -> int:
        self.sent.append((channel, data))
        return self.listeners


class _Down:
    def __init__(self) -> None:
        self.calls = 0

    async def pubsub_numsub(self, channel: str) -> Any:
        self.calls += 1
        raise ConnectionError("down")

    async def publish(self, channel: str, data: bytes) -> int:
        raise AssertionError("must not publish: the audience is unknown")


async def test_the_count_is_kept_for_the_interval_and_asked_again_after() -> None:
    now = [10.0]
    redis = _Counted(listeners=0)
    audience = Audience(redis, "pfx:events", interval=1.0, monotonic=lambda: now[0])  # type: ignore[arg-type]
    assert audience.known() is None  # never counted: only present() may tell
    assert await audience.present() is False
    redis.listeners = 1
    now[0] = 10.9
    assert audience.known() is False
    assert await audience.present() is False  # the last answer, not asked again
    assert redis.numsub_calls == 1
    now[0] = 11.0
    assert audience.known() is None
    assert await audience.present() is True
    assert redis.numsub_calls == 2


async def test_a_local_listener_is_present_without_asking_redis() -> None:
    redis = _Counted(listeners=0)
    audience = Audience(redis, "pfx:events", local=lambda: True)  # type: ignore[arg-type]
    assert await audience.present() is True
    assert redis.numsub_calls == 0


async def test_publisher_sends_nothing_while_nobody_listens() -> None:
    now = [0.0]
    redis = _Counted(listeners=0)
    audience = Audience(redis, "pfx:events", monotonic=lambda: now[0])  # type: ignore[arg-type]
    pub = EventPublisher(redis, "pfx", audience=audience)
    assert await pub.wanted() is False
    assert await pub.publish("enqueued", job_id=1, queue="q", task="t") is False
    assert redis.sent == []
    redis.listeners = 1
    now[0] = 1.0
    assert await pub.publish("enqueued", job_id=2, queue="q", task="t") is True
    assert [channel for channel, _ in redis.sent] == ["pfx:events"]
    assert redis.numsub_calls == 2  # once per interval, not once per event


async def test_publisher_mutes_when_the_audience_cannot_be_counted() -> None:
    now = [100.0]
    redis = _Down()
    pub = EventPublisher(redis, "pfx", mute=5.0, clock=lambda: now[0], audience=Audience(redis, "pfx:events"))  # type: ignore[arg-type]
    assert await pub.publish("enqueued", job_id=1, queue="q", task="t") is False
    assert await pub.wanted() is False
    assert redis.calls == 1  # muted: not asked again for five seconds
    now[0] = 105.1
    assert await pub.wanted() is False
    assert redis.calls == 2
