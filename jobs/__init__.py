"""postbox: register tasks, enqueue them in your own transaction.

from postbox import task, enqueue

@task(queue="mail", priority=7)
async def send_welcome(ctx, user_id: int) -> None: ...

with conn.transaction():
    conn.execute("INSERT INTO users ...")
    enqueue(conn, send_welcome, {"user_id": 42})

What is exported here is the public API (docs/python-api.md). Everything
else is reachable from its module (``postbox.registry``, ``postbox.sql``,
...); ``postbox.relay``, ``postbox.worker`` and ``postbox.app`` are the
processes and the application edge, imported by their entry points.
"""

from postbox.context import JobContext
from postbox.errors import (
    AlreadyProcessed,
    DuplicateTaskError,
    EnqueueError,
    InvalidArgsError,
    InvalidMaxAttemptsError,
    InvalidOptionError,
    InvalidPriorityError,
    InvalidQueueError,
    JobCancelled,
    PayloadTooLargeError,
    PermanentError,
    PostboxError,
    RetryLater,
    ScheduleConflictError,
    SchemaOutdatedError,
    SettingsError,
    Snooze,
    TaskModuleError,
    UnknownTaskError,
    UnsupportedConnectionError,
)
from postbox.flow import FlowLimit, Rate
from postbox.periodic import Schedule, periodic
from postbox.producer import (
    EnqueueOptions,
    JobId,
    Limits,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    prepare,
)
from postbox.registry import Registry, RetryPolicy, TaskSpec, default_registry, limit_queue, task
from postbox.results import JobResult, get_result, get_result_async, wait_result
from postbox.settings import Settings, load_settings
from postbox.states import TERMINAL_STATES, JobState
from postbox.unique import Unique, debounce, throttle
from postbox.workflow import WorkflowError, WorkflowIds, chain, chord, enqueue_workflow, enqueue_workflow_async, group

__all__ = [
    "TERMINAL_STATES",
    "AlreadyProcessed",
    "DuplicateTaskError",
    "EnqueueError",
    "EnqueueOptions",
    "FlowLimit",
    "InvalidArgsError",
    "InvalidMaxAttemptsError",
    "InvalidOptionError",
    "InvalidPriorityError",
    "InvalidQueueError",
    "JobCancelled",
    "JobContext",
    "JobId",
    "JobResult",
    "JobState",
    "Limits",
    "PayloadTooLargeError",
    "PermanentError",
    "PostboxError",
    "Rate",
    "Registry",
    "RetryLater",
    "RetryPolicy",
    "Schedule",
    "ScheduleConflictError",
    "SchemaOutdatedError",
    "Settings",
    "SettingsError",
    "Snooze",
    "TaskModuleError",
    "TaskSpec",
    "Unique",
    "UnknownTaskError",
    "UnsupportedConnectionError",
    "WorkflowError",
    "WorkflowIds",
    "chain",
    "chord",
    "debounce",
    "default_registry",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "enqueue_workflow",
    "enqueue_workflow_async",
    "get_result",
    "get_result_async",
    "group",
    "limit_queue",
    "load_settings",
    "periodic",
    "prepare",
    "task",
    "throttle",
    "wait_result",
]

if __name__ != "postbox":  # this folder imported under its own name, not as the installed package
    raise ImportError("import postbox, not jobs: the folder jobs/ is installed as postbox")
