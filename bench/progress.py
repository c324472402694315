"""Progress lines on stderr while a benchmark runs (stdout carries only the report)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.monotonic()
        self._quiet = quiet

    def say(self, message: str) -> None:
        if self._quiet:
            return
        elapsed = time.monotonic() - self._start
        minutes, seconds = divmod(int(elapsed), 60)
        print(f"[bench {minutes:02d}:{seconds:02d}] {message}", file=self._stream, flush=True)
