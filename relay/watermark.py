"""Per-stream high-water marks: the newest entry id the relay wrote to each stream.

A Redis failover to a replica that missed the last writes keeps the epoch key
(it was replicated long ago) but loses the newest stream entries. Every stream
remembers the last id it generated (``XINFO STREAM`` → ``last-generated-id``,
kept even when entries are deleted); on the new primary it is older than the
newest id this relay got back from an XADD. That is how a lost tail is told
(compared inside Redis: :mod:`postbox.relay.stream_check`).

That look runs about once a second, and it can be too late: the first XADD
to a stream on the new primary gets an id from the clock, newer than any the
relay wrote before, and the lost tail no longer shows in ``last-generated-id``
(at a steady rate the relay writes again within milliseconds of a failover).
So on one server every batch's write also ends with an ``INCRBY`` of a
counter (:func:`postbox.streams.written_key`) by the batch's size, and
:class:`WriteCount` compares each answer with the last one. Replication
applies a primary's writes in order, so a replica that has a batch's
``INCRBY`` has its XADDs too; a replica that missed the last writes missed
their counts, and the next batch's answer comes back lower than the last
answer plus the batch: the loss is noticed at the first write after it,
whatever the entry ids say.
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


class WriteCount:
    """The written counter as this relay last saw it (:func:`postbox.streams.written_key`).

    Only a lower answer than expected tells anything: a higher one is a write whose
    answer was lost (a connection cut after Redis applied it) or a deposed leader's
    last batch, and is taken as the new starting point.
    """

    def __init__(self) -> None:
        self._last: int | None = None

    def answered(self, added: int, value: int) -> bool:
        """A batch of ``added`` entries brought the counter to ``value``: True if writes before it were lost."""
        last, self._last = self._last, value
        return last is not None and value < last + added

    @property
    def counting(self) -> bool:
        """Whether a batch's count was answered since the term began or the last recovery: a loss of
        writes before the next batch shows in that batch's answer (a server refusing INCRBY: never)."""
        return self._last is not None

    def forget(self) -> None:
        """A new term or a recovery: the next answer is the starting point."""
        self._last = None


__all__ = ["EntryId", "HighWater", "WriteCount", "parse_entry_id"]
