"""Per-stream high-water marks: the newest entry id the relay wrote to each stream.

A Redis failover to a replica that missed the last writes keeps the epoch key
(it was replicated long ago) but loses the newest stream entries. Every stream
remembers the last id it generated (``XINFO STREAM`` → ``last-generated-id``,
kept even when entries are deleted); on the new primary it is older than the
newest id this relay got back from an XADD. That is how a lost tail is told
(compared inside Redis: :mod:`postbox.relay.stream_check`).
"""

from __future__ import annotations

from collections.abc import Iterable

EntryId = tuple[int, int]


def parse_entry_id(value: str | bytes) -> EntryId:
    """``"1700000000000-3"`` → ``(1700000000000, 3)``; a typed error for anything else."""
    text = value.decode() if isinstance(value, bytes) else value
    ms, sep, seq = text.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream entry id: {text!r}")
    return int(ms), int(seq)


class HighWater:
    """The newest entry id written per stream key, by this relay in this term."""

    def __init__(self) -> None:
        self._marks: dict[str, EntryId] = {}

    def record(self, keys: Iterable[str], sids: Iterable[str]) -> None:
        for key, sid in zip(keys, sids, strict=True):
            mark = parse_entry_id(sid)
            if mark > self._marks.get(key, (-1, -1)):
                self._marks[key] = mark

    def snapshot(self) -> dict[str, EntryId]:
        """A copy to compare with what Redis reports (take it before asking Redis)."""
        return dict(self._marks)

    def forget(self) -> None:
        """After a loss was found: the republish writes new entries, and new marks."""
        self._marks.clear()


__all__ = ["EntryId", "HighWater", "parse_entry_id"]
