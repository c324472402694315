"""The task registry: ``@task`` and the argument models built from handler signatures."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError

from postbox.errors import (
    DuplicateTaskError,
    InvalidArgsError,
    InvalidMaxAttemptsError,
    InvalidOptionError,
    InvalidPriorityError,
    InvalidQueueError,
    TaskModuleError,
    UnknownTaskError,
)
from postbox.flow import FlowLimit, Rate
from postbox.handle import Task
from postbox.outcomes import RetryPolicy  # the retry decision lives there, with the backoff
from postbox.settings import QUEUE_NAME_RE
from postbox.unique import Unique, rule_json

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    fn: Callable[..., Any]
    queue: str
    priority: int
    max_attempts: int
    timeout: float | None
    retry: RetryPolicy
    keep_result: bool
    result_ttl: float
    args_model: type[BaseModel] = field(repr=False)
    limit: FlowLimit = field(default_factory=FlowLimit)  # flow control declared in code (postbox.flow)
    unique: Unique | None = None  # uniqueness rule (postbox.unique, docs/unique-jobs.md)
    max_snoozes: int = 100  # snoozes that do not count as attempts (postbox.Snooze, docs/job-control.md)
    encrypted: bool = False  # args sealed at rest, opened only by the worker (postbox.encryption)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def args_json(self, args: Mapping[str, Any]) -> bytes:
        """Validated args as compact JSON (what the outbox stores); raises :class:`InvalidArgsError`.

        Serialised by pydantic-core straight from the model: no intermediate
        dict, which is most of the cost of a bulk enqueue.
        """
        model = self._validated(args)
        try:
            return self.args_model.__pydantic_serializer__.to_json(model, exclude_unset=True)
        except PydanticSerializationError as exc:
            raise InvalidArgsError(f"args are not JSON-serialisable: {exc}", field="args") from None

    def validate_args_list(self, args: list[dict[str, Any]]) -> list[BaseModel]:
        """Many items' args in one call into pydantic-core; raises pydantic's ``ValidationError``."""
        return self._list_adapter.validate_python(args)

    @cached_property
    def unique_rule(self) -> str | None:
        """The uniqueness rule as JSON (what ``postbox.tasks.unique_rule`` holds), or None."""
        return rule_json(self.unique, self.args_model)

    @cached_property
    def _list_adapter(self) -> TypeAdapter[list[BaseModel]]:
        return TypeAdapter(list[self.args_model])  # type: ignore[name-defined]

    def _validated(self, args: Mapping[str, Any]) -> BaseModel:
        try:
            return self.args_model.model_validate(args if type(args) is dict else dict(args))
        except ValidationError as exc:
            problems = [
                {"field": ".".join(str(p) for p in err["loc"]) or "args", "message": err["msg"]}
                for err in exc.errors(include_url=False, include_input=False)
            ]
            first = problems[0]
            raise InvalidArgsError(
                f"invalid args for task {self.name!r}: {first['field']}: {first['message']}",
                field=f"args.{first['field']}",
                details={"errors": problems},
            ) from None

    def call_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Args as the handler receives them (validated, typed, defaults applied)."""
        try:
            # The model's validator itself: model_validate() is a Python wrapper around it, on every job.
            model = self.args_model.__pydantic_validator__.validate_python(args if type(args) is dict else dict(args))
        except ValidationError as exc:
            raise InvalidArgsError(f"invalid args for task {self.name!r}: {exc.errors()[0]['msg']}") from None
        return dict(model.__dict__)  # the declared fields (extras live in __pydantic_extra__)


class Registry:
    """Maps task names to :class:`TaskSpec`. One process-wide default instance."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskSpec] = {}
        self.queue_limits: dict[str, FlowLimit] = {}  # declared by limit_queue()

    def add(self, spec: TaskSpec) -> None:
        existing = self._tasks.get(spec.name)
        if existing is not None and existing.fn is not spec.fn:
            if _qualname(existing.fn) != _qualname(spec.fn):
                raise DuplicateTaskError(f"task {spec.name!r} is already registered by {_qualname(existing.fn)}")
        self._tasks[spec.name] = spec

    def get(self, name: str) -> TaskSpec:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(f"unknown task {name!r}", field="task") from None

    def resolve(self, task: str | Callable[..., Any]) -> TaskSpec:
        if isinstance(task, str):
            return self.get(task)
        name = getattr(task, "__postbox_task__", None)
        if name is None:
            raise UnknownTaskError(f"{task!r} is not a registered @task", field="task")
        return self.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def queues(self) -> list[str]:
        return sorted({spec.queue for spec in self._tasks.values()})

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)


default_registry = Registry()


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise InvalidQueueError(f"invalid queue name {queue!r}: must match {QUEUE_NAME_RE.pattern}", field="queue")
    return queue


def check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidPriorityError(f"priority must be an integer 0-9, got {priority!r}", field="priority")
    return priority


def check_max_attempts(max_attempts: int) -> int:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidMaxAttemptsError(
            f"max_attempts must be an integer >= 1, got {max_attempts!r}", field="max_attempts"
        )
    return max_attempts


def build_args_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """A pydantic model of the handler's keyword arguments (the first parameter is ``ctx``)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        raise TypeError(f"task {name!r}: a handler takes ctx as its first parameter")
    fields: dict[str, Any] = {}
    extra = "forbid"
    for param in params[1:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise TypeError(f"task {name!r}: handler arguments must be passable by keyword")
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    hints = inspect.get_annotations(fn, eval_str=True)
    for key in fields:
        if key in hints:
            fields[key] = (hints[key], fields[key][1])
    config = ConfigDict(extra=extra, arbitrary_types_allowed=False)  # type: ignore[typeddict-item]
    return create_model(f"{name}_args", __config__=config, **fields)


def check_partition_arg(task_name: str, partition_by: str, args_model: type[BaseModel]) -> None:
    """Refuse a ``partition_by`` that names no argument of the handler (one taking ``**kwargs`` accepts any)."""
    if partition_by in args_model.model_fields or args_model.model_config.get("extra") == "allow":
        return
    names = ", ".join(args_model.model_fields) or "none"
    raise InvalidOptionError(
        f"task {task_name!r}: partition_by={partition_by!r} is not an argument of the handler (its arguments: {names})",
        field="partition_by",
    )


@overload
def task(fn: Callable[Concatenate[Any, P], R], /) -> Task[P, R]: ...


@overload
def task(
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 5,
    max_attempts: int = 5,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    keep_result: bool = False,
    result_ttl: float = 86_400.0,
    concurrency: int | None = None,
    rate: Rate | str | None = None,
    partition_by: str | None = None,
    unique: Unique | None = None,
    max_snoozes: int = 100,
    encrypted: bool = False,
    registry: Registry | None = None,
) -> Callable[[Callable[Concatenate[Any, P], R]], Task[P, R]]: ...


def task(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 5,
    max_attempts: int = 5,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    keep_result: bool = False,
    result_ttl: float = 86_400.0,
    concurrency: int | None = None,
    rate: Rate | str | None = None,
    partition_by: str | None = None,
    unique: Unique | None = None,
    max_snoozes: int = 100,
    encrypted: bool = False,
    registry: Registry | None = None,
) -> Any:
    """Register ``async def handler(ctx, **typed_args)`` (or a sync one) as a task.

    Usable bare (``@task``) or with options (``@task(queue="mail", priority=7)``).
    Returns a :class:`~postbox.handle.Task`: callable as the handler, with typed
    ``.enqueue(conn, **args)`` / ``.enqueue_async(...)`` and ``.options(...)``.

    Flow control (docs/flow-control.md): ``concurrency`` — at most this many run
    at once across every worker; ``rate`` — at most so many starts per period
    (``"50/s"``, ``"10/m"``, a :class:`~postbox.flow.Rate`); ``partition_by`` —
    the name of an argument: each of its values gets those limits of its own.

    ``unique`` (a :class:`~postbox.unique.Unique`): at most one job per key, for
    a period and/or while in given states; a duplicate enqueue returns the
    existing job (docs/unique-jobs.md).

    ``max_snoozes``: how many times a job of the task may raise (or return)
    :class:`~postbox.errors.Snooze` without consuming an attempt; later snoozes
    count as attempts, like ``RetryLater`` (docs/job-control.md).

    ``encrypted``: the jobs' arguments are sealed by the producer with the
    process's key (``POSTBOX_ENCRYPTION_KEYS``) and opened only by the worker
    (:mod:`postbox.encryption`); a kept result (``keep_result``) is sealed by the
    worker and opened by its readers that have the key; not with ``unique`` (a key
    of sealed arguments would never match).
    """

    def register(func: Callable[..., Any]) -> Task[Any, Any]:
        task_name = name or func.__name__
        check_queue(queue)
        check_priority(priority)
        check_max_attempts(max_attempts)
        if isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or not 0 <= max_snoozes <= 10_000:
            raise InvalidOptionError(
                f"task {task_name!r}: max_snoozes must be an integer 0..10000, got {max_snoozes!r}", field="max_snoozes"
            )
        if timeout is not None and timeout <= 0:
            raise ValueError(f"task {task_name!r}: timeout must be > 0")
        limit = FlowLimit(
            concurrency=concurrency, rate=None if rate is None else Rate.parse(rate), partition_by=partition_by
        )
        if limit.partition_by is not None and limit.empty:
            raise InvalidOptionError(
                f"task {task_name!r}: partition_by needs a concurrency or a rate to partition", field="partition_by"
            )
        args_model = build_args_model(func, task_name)
        if limit.partition_by is not None:
            check_partition_arg(task_name, limit.partition_by, args_model)
            if encrypted:  # (the worker reads the partition from the args as stored: sealed, it would find none)
                raise InvalidOptionError(
                    f"task {task_name!r}: encrypted arguments cannot partition its limits (partition_by)",
                    field="encrypted",
                )
        if unique is not None:
            if not isinstance(unique, Unique):
                raise InvalidOptionError(
                    f"task {task_name!r}: unique must be a postbox.Unique, got {unique!r}", field="unique"
                )
            unique.check_args(task_name, args_model)
            if encrypted:  # (a rule's key is computed from the args as stored)
                raise InvalidOptionError(
                    f"task {task_name!r}: encrypted arguments cannot make a unique key (unique, debounce, throttle)",
                    field="encrypted",
                )
        spec = TaskSpec(
            name=task_name,
            fn=func,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            keep_result=keep_result,
            result_ttl=result_ttl,
            args_model=args_model,
            limit=limit,
            unique=unique,
            max_snoozes=max_snoozes,
            encrypted=bool(encrypted),
        )
        (registry if registry is not None else default_registry).add(spec)
        func.__postbox_task__ = task_name  # type: ignore[attr-defined]
        return Task(spec, func)

    if fn is not None:
        return register(fn)
    return register


def limit_queue(
    queue: str,
    *,
    concurrency: int | None = None,
    rate: Rate | str | None = None,
    registry: Registry | None = None,
) -> FlowLimit:
    """Declare a queue's limits, across every worker: at most ``concurrency`` of its jobs
    run at once, at most ``rate`` start per period (``"20/s"``). Call it where the
    tasks are defined (a worker applies what its task modules declare)::

        postbox.limit_queue("mail", concurrency=20, rate="50/s")
    """
    check_queue(queue)
    limit = FlowLimit(concurrency=concurrency, rate=None if rate is None else Rate.parse(rate))
    (registry if registry is not None else default_registry).queue_limits[queue] = limit
    return limit


def load_task_modules(modules: Iterable[str], cwd: str | None = None) -> list[str]:
    """Import the modules that define ``@task`` handlers; returns their names.

    The current directory (``cwd``) is importable first, as with Celery's ``-A``:
    ``postbox worker run --tasks myapp.tasks`` from the application's folder finds
    ``myapp`` without an install. A module that fails to import raises
    :class:`TaskModuleError` with the real exception and its traceback.
    """
    folder = os.getcwd() if cwd is None else cwd
    if folder not in sys.path and os.path.abspath(folder) not in (os.path.abspath(p or ".") for p in sys.path):
        sys.path.insert(0, folder)
    loaded = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a task module's own bug is reported, not hidden
            raise TaskModuleError(module, exc, traceback.format_exc()) from exc
        loaded.append(module)
    return loaded


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
