"""What ``@task`` returns: the handler, still callable, with typed enqueue methods.

``send_receipt.enqueue(conn, order_id=7)`` checks its arguments against the
handler's own signature, for the type checker (a wrong name or type is a mypy
error) and at run time (pydantic, as ``enqueue(conn, send_receipt, {...})``
does). Per-call options go through :meth:`Task.options`, which returns a handle
with those options bound: ``send_receipt.options(priority=9, delay=60).enqueue(conn, order_id=7)``.
Calling the handle calls the handler, so unit tests call it as before.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, Unpack

if TYPE_CHECKING:
    from postbox.connections import AsyncTarget, SyncTarget
    from postbox.producer import EnqueueOptions, JobId
    from postbox.registry import TaskSpec
    from postbox.workflow import Signature

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A registered task. ``P`` and ``R`` are the handler's parameters after ``ctx``, and its return type."""

    __postbox_task__: str

    def __init__(
        self, spec: TaskSpec, fn: Callable[Concatenate[Any, P], R], options: EnqueueOptions | None = None
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.__postbox_task__ = spec.name
        self._fn = fn
        self._options: EnqueueOptions = {**options} if options else {}
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, ctx: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the handler directly (a unit test's call): no job, no transaction."""
        return self._fn(ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<postbox task {self.name!r} ({self.spec.queue}, priority {self.spec.priority})>"

    def options(self, **options: Unpack[EnqueueOptions]) -> Task[P, R]:
        """A handle whose enqueues carry these options (:class:`postbox.EnqueueOptions`; None keeps the handle's).

        Their names and types are checked by the type checker here, their values at
        enqueue, as ``enqueue()``'s are.
        """
        merged: EnqueueOptions = {**self._options}
        for name, value in options.items():
            if value is not None:
                merged[name] = value  # type: ignore[literal-required]
        return Task(self.spec, self._fn, merged)

    def enqueue(self, conn: SyncTarget, /, *args: P.args, **kwargs: P.kwargs) -> JobId:
        """Enqueue one job of this task in ``conn``'s transaction (see :func:`postbox.enqueue`); its id."""
        from postbox.producer import enqueue

        return enqueue(conn, self.name, self._args(args, kwargs), **self._options)

    async def enqueue_async(self, conn: AsyncTarget, /, *args: P.args, **kwargs: P.kwargs) -> JobId:
        """The async twin of :meth:`enqueue`."""
        from postbox.producer import enqueue_async

        return await enqueue_async(conn, self.name, self._args(args, kwargs), **self._options)

    def s(self, /, *args: P.args, **kwargs: P.kwargs) -> Signature[R]:
        """This task with these arguments, as one job of a workflow (:mod:`postbox.workflow`).

        Checked like :meth:`enqueue` (a wrong argument is a type error); the handle's options come along.
        """
        from postbox.workflow import signature

        return signature(self, self._args(args, kwargs))

    def _args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not args:
            return kwargs
        from postbox.errors import InvalidArgsError

        try:
            bound = self._signature.bind_partial(None, *args, **kwargs)
        except TypeError as exc:
            raise InvalidArgsError(f"invalid args for task {self.name!r}: {exc}", field="args") from None
        return {name: value for name, value in list(bound.arguments.items())[1:]}
