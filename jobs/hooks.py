"""Hooks around job execution, for error trackers (Sentry), custom metrics or tracing.

Register them in a module the workers import (a task module is the usual place)::

    @postbox.hooks.on_failure
    def report(run: postbox.hooks.JobRun, exc: BaseException) -> None:
        sentry_sdk.capture_exception(exc)

The contract:

- ``before_run(run)`` is called just before the handler, ``after_run(run)``
  after every run whatever its end (``run.state`` says it: succeeded,
  retrying, dead, cancelled; ``run.duration`` in seconds), and
  ``on_failure(run, exc)`` when the handler raised, before ``after_run``.
- They run in the worker's event loop (an ``async def`` hook is awaited), so
  they must be quick: a hook that blocks holds up every job of the process.
- A hook's own exception is logged with its traceback and otherwise ignored:
  it never changes the job's outcome, and the next hook still runs.
- They see the job's id, task, queue, attempt and worker, never its args (a
  hook that needs them reads them in the handler instead).

``in_handler_thread(fn)`` is the one hook that runs elsewhere: ``fn()`` is
called on the thread that runs a *sync* handler, just before and just after
each call, so it can act on that thread's own state (``postbox.django`` closes
the thread's obsolete Django connections there, as Django does around each
request). Its exception is logged and ignored too.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)


@dataclass
class JobRun:
    job_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    worker_id: str
    state: str | None = None  # set for after_run: succeeded, retrying, dead, cancelled
    duration: float | None = None  # seconds, set for after_run
    extra: dict[str, Any] = field(default_factory=dict)  # free for hooks to pass things along


Hook = Callable[..., Awaitable[None] | None]
H = TypeVar("H", bound=Hook)


@dataclass
class Hooks:
    before: list[Hook] = field(default_factory=list)
    after: list[Hook] = field(default_factory=list)
    failure: list[Hook] = field(default_factory=list)
    thread: list[Callable[[], object]] = field(default_factory=list)  # around sync handlers, on their thread

    def __bool__(self) -> bool:
        return bool(self.before or self.after or self.failure)


registered = Hooks()


def before_run(fn: H) -> H:
    """Register ``fn(run)``, called before each run's handler."""
    registered.before.append(fn)
    return fn


def after_run(fn: H) -> H:
    """Register ``fn(run)``, called after each run, ``run.state`` and ``run.duration`` set."""
    registered.after.append(fn)
    return fn


def on_failure(fn: H) -> H:
    """Register ``fn(run, exc)``, called when a run's handler raised."""
    registered.failure.append(fn)
    return fn


def in_handler_thread(fn: Callable[[], object]) -> Callable[[], object]:
    """Register ``fn()``, called on a sync handler's thread before and after each call (once each)."""
    if fn not in registered.thread:
        registered.thread.append(fn)
    return fn


def clear() -> None:
    """Forget every hook (tests)."""
    registered.before.clear()
    registered.after.clear()
    registered.failure.clear()
    registered.thread.clear()


def on_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped in the :func:`in_handler_thread` hooks; ``fn`` itself when there are none."""
    around = list(registered.thread)
    if not around:
        return fn

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _call_sync(around)
        try:
            return fn(*args, **kwargs)
        finally:
            _call_sync(around)

    return wrapped


def _call_sync(hooks: list[Callable[[], object]]) -> None:
    for hook in hooks:
        try:
            hook()
        except Exception:
            log.exception("a postbox hook raised; ignored", extra={"hook": getattr(hook, "__qualname__", repr(hook))})


async def call(hooks: list[Hook], *args: Any) -> None:
    """Call each hook; a hook's exception is logged and ignored."""
    for hook in hooks:
        try:
            result = hook(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("a postbox hook raised; ignored", extra={"hook": getattr(hook, "__qualname__", repr(hook))})
