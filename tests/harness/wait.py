"""The tests' one way to wait: a condition polled with a deadline, or a signal awaited with one.

Prefer a signal where the code exposes one (``RelaySignals``, ``WorkerSignals``: an
:class:`asyncio.Event` or :class:`asyncio.Queue` a test awaits with :func:`wait_event`,
:func:`next_item` or :func:`take`). Where it does not (a row in PostgreSQL, a process's
output, a server coming up), poll the condition with :func:`wait_until` (blocking) or
:func:`wait_until_async` (in an event loop; the condition may be sync or async).

Deadlines are generous: they bound a hang, they do not measure speed. A test that
asserts a bound on time measures it itself (``time.monotonic()`` around the wait).
On a timeout the error names what was awaited and the last value the condition
returned (or the last exception it raised, for an exception listed in ``ignore``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

Message = str | Callable[[], str]
"""What is awaited, for the timeout's error: a text, or a function called only on timeout (to add logs)."""


def _describe(message: Message) -> str:
    return message() if callable(message) else message


def _timed_out(timeout: float, message: Message, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout}s waiting for {_describe(message)}; last observed: {last!r}")


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    *,
    interval: float = 0.05,
    message: Message = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns a truthy value; return that value.

    An exception of a type in ``ignore`` counts as "not yet" (a server still starting
    refuses connections). After ``timeout`` seconds, fail with an ``AssertionError``
    naming ``message`` and the last value observed.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, message, last)
        time.sleep(interval)


async def wait_until_async(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = 30.0,  # noqa: ASYNC109  (the test's deadline, the same parameter as the sync twin's)
    *,
    interval: float = 0.02,
    message: Message = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`wait_until` inside an event loop: ``condition`` may return a value or an awaitable."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except ignore as exc:
            last = exc
        else:
            if value:
                return value  # type: ignore[return-value]  # not an awaitable once awaited
            last = value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, message, last)
        await asyncio.sleep(interval)


async def wait_event(
    event: asyncio.Event | None,
    timeout: float = 30.0,  # noqa: ASYNC109  (the test's deadline)
    *,
    message: Message = "the event",
) -> None:
    """Wait for ``event`` to be set (a signal the code fires); fail after ``timeout`` seconds."""
    assert event is not None, f"no signal to wait for: {_describe(message)}"
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {_describe(message)}") from None


async def next_item(
    queue: asyncio.Queue[T] | None,
    timeout: float = 30.0,  # noqa: ASYNC109  (the test's deadline)
    *,
    message: Message = "the next item",
) -> T:
    """The next item the code puts on ``queue`` (a signal); fail after ``timeout`` seconds."""
    assert queue is not None, f"no signal to wait for: {_describe(message)}"
    try:
        return await asyncio.wait_for(queue.get(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {_describe(message)}") from None


async def take(
    queue: asyncio.Queue[T] | None,
    count: int,
    timeout: float = 30.0,  # noqa: ASYNC109  (the test's deadline for all of them)
    *,
    message: Message = "items",
) -> list[T]:
    """The next ``count`` items put on ``queue``, all within ``timeout`` seconds; fail naming those that came."""
    assert queue is not None, f"no signal to wait for: {_describe(message)}"
    got: list[T] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        try:
            got.append(await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            raise AssertionError(
                f"only {len(got)} of {count} {_describe(message)} within {timeout}s: {got!r}"
            ) from None
    return got
