"""Threads for sync handlers: daemon threads, reused when idle, abandoned when stuck.

A thread cannot be stopped from outside. When a sync handler's job is
cancelled or times out, the worker stops waiting for it: the job's outcome is
recorded and its slot freed at once, and the thread is *abandoned* — it runs on
until the handler returns, and its result is dropped. Daemon threads never
hold up the process's exit, so a stuck handler cannot keep a stopping worker
alive (a ``concurrent.futures`` pool joins its threads at exit). A thread is
reused for the next call once its handler returns; a call that finds no idle
thread starts one.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any


class _Call:
    __slots__ = ("fn", "future", "returned")

    def __init__(self, fn: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.future = future
        self.returned = False  # set by the thread once the handler returned (or raised)


class HandlerThreads:
    def __init__(self, name_prefix: str) -> None:
        self._prefix = name_prefix
        self._work: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work and not yet promised to a call
        self._started = 0
        self._abandoned: set[_Call] = set()

    @property
    def abandoned(self) -> int:
        """Calls whose waiter gave up (cancel, timeout, shutdown) and whose handler still runs."""
        self._abandoned = {call for call in self._abandoned if not call.returned}
        return len(self._abandoned)

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` on a handler thread and await its value; cancelling abandons the thread."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        context = contextvars.copy_context()
        call = _Call(lambda: context.run(fn, *args, **kwargs), future)
        self._submit(call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if not call.returned:
                self._abandoned.add(call)
            future.cancel()  # its value, when it comes, is dropped
            raise

    def _submit(self, call: _Call) -> None:
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1
        self._work.put(call)
        if spawn:
            threading.Thread(target=self._serve, name=f"{self._prefix}-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            call = self._work.get()
            if call is None:
                return
            try:
                value = call.fn()
            except BaseException as exc:  # delivered to the awaiting task, as run_in_executor does
                _deliver(call, None, exc)
            else:
                _deliver(call, value, None)
            del call
            with self._lock:
                self._idle += 1

    def shutdown(self) -> None:
        """Let idle threads end; busy ones end with their handler (daemon: they never hold up exit)."""
        with self._lock:
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._work.put(None)


def _deliver(call: _Call, value: Any, exc: BaseException | None) -> None:
    call.returned = True
    future = call.future

    def settle() -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass
