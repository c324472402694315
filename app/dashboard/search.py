"""The dashboard's job filter: checked once, then the same rows for the listing, the count and bulk actions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from postbox.app.services.checks import check_queue_name, check_state, check_text
from postbox.app.services.errors import InvalidInputError

BULK_MAX = 10_000  # rows one bulk action touches at most (and where "select all matching" stops counting)
TEXT_MAX = 200
# A text match reads the args of every row it passes (no index can serve a substring of JSON), so
# one page of a text search looks at this many ids at most, then offers to go on below them.
TEXT_WINDOW = 20_000
# A creation-time bound is turned into an id bound (ids grow with created_at), then widened by this
# much: created_at is the enqueuing transaction's start, so a row inserted late in a long transaction
# has an older created_at than the rows before it. Only a transaction open longer than this across
# a bound can leave its job out of a time-filtered search.
CREATION_SLACK = timedelta(minutes=5)


def like_pattern(text: str) -> str:
    """``text`` as an ILIKE pattern matching it anywhere, its own ``%``, ``_`` and ``\\`` taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True)
class JobFilter:
    """Which jobs: every field None matches everything. ``text`` is a substring of the args' JSON."""

    queue: str | None = None
    task: str | None = None
    state: str | None = None
    discarded: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if self.queue is not None:
            check_queue_name(self.queue)
        if self.task is not None:
            check_text(self.task, "task")
        if self.state is not None:
            check_state(self.state)
        if self.text is not None:
            check_text(self.text, "text", TEXT_MAX)
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidInputError(f"{name} must carry a time zone", field=name)
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise InvalidInputError("since must be before until", field="since")

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "task": self.task,
            "state": self.state,
            "discarded": self.discarded,
            "since": self.since,
            "until": self.until,
            "text": None if self.text is None else like_pattern(self.text),
        }
