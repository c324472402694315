"""Job states, exactly the words stored in ``outbox.state``."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    WAITING = "waiting"  # a workflow's job whose upstream jobs have not all ended (never published)
    PENDING = "pending"  # committed, waiting for the relay (delayed: future available_at)
    QUEUED = "queued"  # published to a stream
    RUNNING = "running"  # claimed by a worker for the current attempt
    RETRYING = "retrying"  # failed an attempt; waiting for available_at, then republished
    SUCCEEDED = "succeeded"
    DEAD = "dead"  # in the dead letters
    CANCELLED = "cancelled"
    EXPIRED = "expired"


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED, JobState.EXPIRED}
)
ALL_STATES: tuple[str, ...] = tuple(state.value for state in JobState)


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES
