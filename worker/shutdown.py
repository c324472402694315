"""SIGTERM/SIGINT for a worker process: drain, then a hard deadline that always holds.

The first signal stops reading and drains (:meth:`~postbox.worker.worker.Worker.stop`); the process
is then sure to end within ``drain_timeout + GRACE`` seconds. A second signal
ends the drain at once (unfinished jobs stay unacknowledged for another
worker) and the process within ``ABORT_GRACE``. Should anything hold the
process past its deadline (a hung connection close, a library's blocking
call on the event loop), a watchdog thread ends it with exit status
:data:`EXIT_FORCED`: never anything that outlives the bound.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

GRACE = 10.0  # seconds past the drain timeout for outcomes, the registry row, closing connections
ABORT_GRACE = 2.0  # seconds after a second signal
EXIT_FORCED = 3


class Stoppable(Protocol):
    def stop(self) -> None: ...


class ShutdownGuard:
    def __init__(
        self,
        worker: Stoppable,
        drain_timeout: float,
        *,
        grace: float = GRACE,
        abort_grace: float = ABORT_GRACE,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self._worker = worker
        self._drain_timeout = drain_timeout
        self._grace = grace
        self._abort_grace = abort_grace
        self._exit = exit
        self.signals = 0
        self._timers: list[threading.Timer] = []

    def on_signal(self) -> None:
        """Call from the event loop's signal handler."""
        self.signals += 1
        self._worker.stop()
        deadline = self._drain_timeout + self._grace if self.signals == 1 else self._abort_grace
        timer = threading.Timer(deadline, self._force, args=(deadline,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def cancel(self) -> None:
        """No forced exit (tests). The CLI never cancels: the deadline holds until the process is gone."""
        for timer in self._timers:
            timer.cancel()

    def _force(self, after: float) -> None:
        log.error("worker still running %.1f s after the stop signal; exiting now", after)
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # exiting anyway
                pass
        self._exit(EXIT_FORCED)
