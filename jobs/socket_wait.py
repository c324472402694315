"""A psycopg connection that keeps its socket registered with the event loop between round trips.

psycopg's async wait (``psycopg.waiting.wait_async``) registers the
connection's socket with the event loop before each wait for an answer and
removes it after: about six ``epoll_ctl`` calls per round trip (half of them
failing, as the loop re-adds a descriptor it still watches), plus a timer for
the wait's 0.1 s interval and the handles around both. A ``ctx.transaction()``
job makes three round trips, a claim or a batch of outcomes one each; that
bookkeeping was about a fifth of the worker's CPU per ``ctx.transaction()``
job (docs/benchmarks.md, "The socket kept registered").

:class:`Connection` waits for an answer on a reader that stays registered
from one round trip to the next. Readiness that arrives while nobody waits (a
NOTIFY or notice on an idle session, the server hanging up) takes the reader
off, so an unread socket never spins the loop; the next wait puts it back.
psycopg's own wait does the rest, with the reader taken off first (its
``add_reader`` would replace this one's callback and its ``remove_reader``
drop it): a wait with a timeout, a socket not writable at once, an
interruption (a cancelled task's query is cancelled on the server, as
psycopg does). As psycopg's, a run of waits that never block (a pipeline's
sends) lets other tasks run every :data:`BUSY_LIMIT` seconds. The reader
holds the connection, so a connection cannot be collected, and its
descriptor reused, while the loop still watches it; :meth:`Connection.close`
takes the reader off first.
"""

from __future__ import annotations

import asyncio
import logging
import select
from time import monotonic
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg import errors as pg_errors
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus
from psycopg.waiting import READY_NONE, READY_R, READY_W, WAIT_R, WAIT_W, Wait

log = logging.getLogger(__name__)

T = TypeVar("T")

_INTERRUPTED = (asyncio.CancelledError, KeyboardInterrupt, SystemExit)

# Seconds a wait may go without readiness before its reader is registered afresh (_Reader.on_watch);
# psycopg's own wait looks again at the same interval.
WATCH_INTERVAL = 0.1

# Most seconds a run of waits that never block (a pipeline's sends, answers already in) keeps the
# loop to itself before it lets other tasks run; psycopg's own wait yields as often.
BUSY_LIMIT = 0.005
_last_yield = 0.0


def _ready_select(fd: int, state: int) -> int:
    """Which of ``state``'s directions ``fd`` is ready for now (no waiting)."""
    readable, writable, _ = select.select([fd] if state & WAIT_R else [], [fd] if state & WAIT_W else [], [], 0)
    return (READY_R if readable else READY_NONE) | (READY_W if writable else READY_NONE)


try:  # psycopg's own check (in C where psycopg_c or psycopg_binary is installed)
    from psycopg.waiting import _ready as _ready_now
except ImportError:  # pragma: no cover - another psycopg layout
    _ready_now = _ready_select


class _Reader:
    """A connection's socket on one event loop, and the wait its readiness ends."""

    __slots__ = ("conn", "fd", "loop", "registered", "seen", "waiting", "watch")

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.conn = conn  # the loop holds the reader while registered, and so the connection (module docstring)
        self.loop = loop
        self.fd = fd
        self.waiting: asyncio.Future[None] | None = None
        self.registered = False
        self.watch: asyncio.TimerHandle | None = None
        self.seen: asyncio.Future[None] | None = None  # the wait pending at the last watch

    def wait(self) -> asyncio.Future[None]:
        """A wait for the socket to be readable, with the reader registered and watched."""
        waiting = self.waiting = self.loop.create_future()
        self.register()
        if self.watch is None:
            self.watch = self.loop.call_later(WATCH_INTERVAL, self.on_watch)
        return waiting

    def on_readable(self) -> None:
        waiting = self.waiting
        if waiting is None:
            # Nobody waits. Either the wait this readiness was for has read its answer
            # already (the standard loop runs a reader's callback one turn after its task's
            # wake-up: the socket is no longer readable), or nobody asked: a NOTIFY or notice
            # on an idle session, or the server hung up. Level-triggered, the latter would fire
            # at every turn of the loop until read: let go.
            if _ready_now(self.fd, WAIT_R):
                self.unregister()
        elif not waiting.done():
            waiting.set_result(None)
        # else: woken already, its task not yet run (the answer is still unread)

    def on_watch(self) -> None:
        """The same wait pending a whole interval: register the socket afresh and let the wait look again.

        A loop may drop a reader without a word: uvloop closes a descriptor's poll
        after an error on the socket (a reset connection), having run the reader's
        callback once. A wait begun after that would never end; this ends it within
        two intervals, and the connection's generator, looking again, meets the error.
        A wait that is only long (a slow query) is registered again once an interval.
        """
        self.watch = None
        waiting = self.waiting
        if waiting is None:
            self.seen = None
            return  # no wait: the next one starts the watch again
        if waiting is self.seen and not waiting.done():
            self.unregister()
            waiting.set_result(None)  # a look with nothing to read is harmless: the generator waits again
        self.seen = waiting
        self.watch = self.loop.call_later(WATCH_INTERVAL, self.on_watch)

    def register(self) -> None:
        if not self.registered:
            self.loop.add_reader(self.fd, self.on_readable)
            self.registered = True

    def unregister(self) -> None:
        if self.registered:
            self.registered = False
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)

    def stop(self) -> None:
        self.unregister()
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None


def _resumed(state: Wait, gen: PQGen[T]) -> PQGen[T]:
    """``gen`` after its first ``next()`` (which asked for ``state``), for psycopg's own wait to go on with."""
    ready = yield state
    while True:
        try:
            state = gen.send(ready)
        except StopIteration as stop:
            return stop.value
        ready = yield state


class Connection(AsyncConnection[Any]):
    """An ``AsyncConnection`` whose waits for answers keep its socket registered (module docstring)."""

    _reader: _Reader | None = None

    async def wait(self, gen: PQGen[T], interval: float = 0.1, timeout: float | None = None) -> T:  # noqa: ASYNC109 (psycopg's signature)
        global _last_yield
        try:
            state = next(gen)
        except StopIteration as stop:  # answered without waiting
            if monotonic() - _last_yield >= BUSY_LIMIT:
                await asyncio.sleep(0)
                _last_yield = monotonic()
            return stop.value
        if timeout is not None:
            return await self._psycopg_wait(_resumed(state, gen), interval, timeout)
        loop = asyncio.get_running_loop()
        fd = self.pgconn.socket
        reader = self._reader
        if reader is None or reader.loop is not loop or reader.fd != fd:
            if reader is not None:
                reader.stop()
            reader = self._reader = _Reader(self, loop, fd)
        try:
            while True:
                if state & WAIT_W:
                    if monotonic() - _last_yield >= BUSY_LIMIT:
                        await asyncio.sleep(0)
                        _last_yield = monotonic()
                    ready = _ready_now(fd, state)
                    if not ready:  # rarely: the send buffer is full
                        break
                    state = gen.send(ready)
                    continue
                if state != WAIT_R:
                    raise pg_errors.InternalError(f"bad poll status: {state}")
                try:
                    await reader.wait()
                finally:
                    reader.waiting = None
                    _last_yield = monotonic()
                state = gen.send(READY_R)
        except StopIteration as stop:
            return stop.value
        except OSError as exc:  # as psycopg's wait reports a socket gone
            reader.unregister()
            raise pg_errors.OperationalError("connection socket closed") from exc
        except _INTERRUPTED:
            reader.unregister()
            await self._cancel_interrupted(gen, interval)
            raise
        except BaseException:
            reader.unregister()
            raise
        return await self._psycopg_wait(_resumed(state, gen), interval, None)  # (it handles its interruptions)

    async def _psycopg_wait(self, gen: PQGen[T], interval: float, limit: float | None) -> T:
        if self._reader is not None:
            self._reader.unregister()
        return await super().wait(gen, interval, limit)

    async def _cancel_interrupted(self, gen: PQGen[Any], interval: float) -> None:
        """A wait interrupted with its query still running: cancel it on the server, as psycopg's wait does.

        Otherwise the session stays busy with it. A server that does not end the
        query within 5 s, or a second interruption, leaves the session in an
        unknown state: it is closed.
        """
        if self.pgconn.transaction_status != TransactionStatus.ACTIVE:
            return
        try:
            await self.cancel_safe(timeout=5.0)
            await super().wait(gen, interval, 5.0)
        except pg_errors.QueryCanceled:
            pass  # what the cancel asks for
        except BaseException as exc:
            log.warning("query not ended after its cancellation (%s): closing the connection", type(exc).__name__)
            self.pgconn.finish()

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
        await super().close()
