"""A consumer's cursor on the wake-up stream, and its check for missed wake-ups (no I/O).

The relay ends each batch's write with an entry in the wake-up stream
(:func:`postbox.streams.wake_key`). A consumer over many streams blocks on that
stream after a cursor: taken by a drained read of every stream (in the same
script run, so every entry written before it was read), then moved to each
wake-up entry a wait takes. :class:`WakeCursor` keeps that cursor, the list of
streams it covers, and decides when the consumer should stop trusting the
wake-up stream: a wait that timed out followed by reads of the same streams
that found entries while the wake-up stream's newest id was still the cursor
means entries came with no wake-up entry (a relay of an earlier version). The
consumer (:mod:`postbox.worker.consumer`) then waits on the streams themselves
for ``off_for`` seconds.

It takes two such timeouts in a row, with no wake-up between them. One can
be a coincidence: a relay's batch is one send, but Redis reads a large send
in parts and may run the consumer's read between the batch's entries and its
wake-up entry, after a second in which nothing was written at all. A relay
of an earlier version is found a second later than it would be with one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


class WakeCursor:
    def __init__(self, *, off_for: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._off_for = off_for
        self._monotonic = monotonic
        self._at: tuple[Sequence[str], str] | None = None  # (the streams covered, a list not modified; the cursor)
        self._timed_out = False  # the last wait on the wake-up stream ended at its timeout
        self._found = 0  # entries the reads of every stream found since
        self._suspect = False  # the last timeout judged looked like a missed wake-up (one is not enough)
        self._off_until = float("-inf")

    def on(self) -> bool:
        """Whether the wake-up stream is trusted now (not within ``off_for`` of a missed wake-up)."""
        return self._monotonic() >= self._off_until

    def cursor_for(self, streams: Sequence[str]) -> str | None:
        """The cursor, when it covers ``streams`` (the same list) and the wake-up stream is trusted."""
        at = self._at
        return at[1] if at is not None and at[0] is streams and self.on() else None

    def woke(self, last: str) -> None:
        """A wait took wake-up entries up to ``last`` (and the streams they name are read).

        The wake-up stream is alive: a timeout before this wake-up says nothing about entries read after it.
        """
        self._timed_out, self._found, self._suspect = False, 0, False
        if self._at is not None:
            self._at = (self._at[0], last)

    def timed_out(self) -> None:
        """A wait on the wake-up stream took no entry (its timeout, or it was ended)."""
        self._timed_out, self._found = True, 0

    def read_every_stream(self, streams: Sequence[str], found: int, drained: bool, tail: str | None) -> bool:
        """A read of every stream of ``streams`` found ``found`` entries; ``drained``: fewer than it asked
        for, and then ``tail`` is the wake-up stream's newest id taken in the same run (None: not asked).

        Takes ``tail`` as the cursor; True when the entries found after this timeout and the one
        judged before it (no wake-up between them) came with no wake-up entry: then the cursor is
        dropped and the wake-up stream not trusted for ``off_for``.
        """
        if self._timed_out:
            self._found += found
        if not drained:
            return False  # the next read is one of every stream again
        at = self._at
        judged = self._timed_out
        looks_missed = (
            judged
            and self._found > 0
            and at is not None
            and at[0] is streams  # (a queue resumed since: its entries came before the cursor)
            and tail == at[1]
        )
        self._timed_out, self._found = False, 0
        missed = looks_missed and self._suspect
        if judged:
            self._suspect = looks_missed and not missed
        if missed:
            self._off_until = self._monotonic() + self._off_for
            tail = None
        self._at = None if tail is None else (streams, tail)
        return missed
