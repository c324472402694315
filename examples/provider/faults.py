"""The provider's misbehaviour, for tests: what to do after a delivery, decided by a seeded draw."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass


class AfterDelivery(enum.Enum):
    ANSWER = "answer"  # behave: answer 201
    FAIL = "fail"  # answer 500 although the message went out
    STALL = "stall"  # hold the answer past the client's timeout


@dataclass(frozen=True)
class Faults:
    fail_after_delivery: float = 0.0
    stall_after_delivery: float = 0.0
    stall_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("fail_after_delivery", "stall_after_delivery"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
        if self.fail_after_delivery + self.stall_after_delivery > 1.0:
            raise ValueError("fail_after_delivery + stall_after_delivery must not exceed 1")
        if self.stall_seconds < 0:
            raise ValueError("stall_seconds must be >= 0")

    def decide(self, rand: Callable[[], float]) -> AfterDelivery:
        draw = rand()
        if draw < self.fail_after_delivery:
            return AfterDelivery.FAIL
        if draw < self.fail_after_delivery + self.stall_after_delivery:
            return AfterDelivery.STALL
        return AfterDelivery.ANSWER


def seeded(seed: int | None) -> Callable[[], float]:
    return random.Random(seed).random
