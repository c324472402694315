"""postbox's core: register tasks, enqueue them in your own transaction.

from jobs import task, enqueue

@task(queue="mail", priority=7)
async def send_welcome(ctx, user_id: int) -> None: ...

with conn.transaction():
    conn.execute("INSERT INTO users ...")
    enqueue(conn, send_welcome, {"user_id": 42})
"""

from jobs.errors import (
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
    SettingsError,
    UnknownTaskError,
)
from jobs.producer import Limits, enqueue, enqueue_async, enqueue_many, enqueue_many_async, prepare
from jobs.registry import Registry, RetryPolicy, TaskSpec, default_registry, task
from jobs.results import JobResult, get_result, get_result_async, wait_result
from jobs.settings import Settings, load_settings
from jobs.states import TERMINAL_STATES, JobState

__all__ = [
    "TERMINAL_STATES",
    "AlreadyProcessed",
    "DuplicateTaskError",
    "EnqueueError",
    "InvalidArgsError",
    "InvalidMaxAttemptsError",
    "InvalidOptionError",
    "InvalidPriorityError",
    "InvalidQueueError",
    "JobCancelled",
    "JobResult",
    "JobState",
    "Limits",
    "PayloadTooLargeError",
    "PermanentError",
    "PostboxError",
    "Registry",
    "RetryLater",
    "RetryPolicy",
    "ScheduleConflictError",
    "Settings",
    "SettingsError",
    "TaskSpec",
    "UnknownTaskError",
    "default_registry",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "get_result",
    "get_result_async",
    "load_settings",
    "prepare",
    "task",
    "wait_result",
]
