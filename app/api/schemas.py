"""Request and response bodies of the REST API (they make the OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

QUEUE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. NOT_FOUND, QUEUE_FULL, VALIDATION_ERROR.")
    message: str = Field(description="Human-readable explanation.")
    details: dict[str, Any] = Field(default_factory=dict, description="Extra context (field, state, limits...).")


class ErrorResponse(BaseModel):
    error: ErrorBody


class EnqueueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=200, description="Registered task name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Handler arguments (validated by the task).")
    queue: str | None = Field(default=None, pattern=QUEUE_PATTERN, description="Override the task's queue.")
    priority: int | None = Field(default=None, ge=0, le=9, description="0-9, 9 highest.")
    delay_seconds: float | None = Field(default=None, ge=0, le=315_360_000, description="Run after this delay.")
    run_at: datetime | None = Field(default=None, description="Run at this time (timezone-aware).")
    max_attempts: int | None = Field(default=None, ge=1, le=1000)
    dedup_key: str | None = Field(
        default=None, min_length=1, max_length=512, description="Per-queue dedup key (Idempotency-Key header wins)."
    )
    keep_result: bool | None = Field(default=None, description="Keep the handler's return value.")


class Attempt(BaseModel):
    attempt: int = Field(description="Attempt number within its life (1 = first).")
    life: int = Field(description="1 for the job's first life; +1 after each DLQ requeue.")
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None = Field(
        description="succeeded, retry, snoozed, dead, cancelled, lost, duplicate; null while running."
    )
    error_class: str | None
    error: str | None
    traceback: str | None = Field(
        default=None, description="The failed attempt's traceback, its last 8,000 characters; null otherwise."
    )


class JobSummary(BaseModel):
    id: int
    task: str
    queue: str
    priority: int
    state: str
    attempts: int
    max_attempts: int
    created_at: datetime
    available_at: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    cancel_requested_at: datetime | None
    discarded_at: datetime | None
    dedup_key: str | None
    worker_id: str | None
    last_error_class: str | None
    last_error: str | None


REDACTED = (
    "True when args and result were withheld (null): reading them needs X-API-Key, unless POSTBOX_API_PUBLIC_ARGS=true."
)


class JobProgress(BaseModel):
    done: float = Field(description="How much of the work is done (the handler's unit).")
    total: float | None = Field(description="Out of how much; null when the handler does not know.")
    note: str | None = Field(description="The handler's short note (at most 200 characters); null when redacted.")
    attempt: int = Field(description="The attempt that reported it.")
    at: datetime = Field(description="When it was written.")


class Job(JobSummary):
    args: dict[str, Any] | None = Field(description="The handler's arguments; null when redacted.")
    keep_result: bool
    result: Any = Field(default=None, description="The handler's return value when kept; null when redacted.")
    history: list[Attempt]
    progress: JobProgress | None = Field(
        default=None,
        description="The last ctx.progress() a run reported (written at most once a second, and at its end);"
        " null when none did.",
    )
    redacted: bool = Field(default=False, description=REDACTED)


class EnqueuedJob(Job):
    duplicate: bool = Field(description="True when an existing job with the same key was returned.")


class JobPage(BaseModel):
    items: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null at the end.")


class CancelResult(BaseModel):
    id: int
    queue: str
    task: str
    state: str = Field(description="cancelled, or running when a cancel was requested.")
    cancel_requested: bool = Field(description="True: the job runs; its worker cancels it cooperatively.")


class JobResult(BaseModel):
    id: int
    state: str
    finished: bool = Field(description="False when the wait ended before the job finished.")
    result: Any = None
    error_class: str | None = None
    error: str | None = None
    redacted: bool = Field(default=False, description=REDACTED)


class RateValue(BaseModel):
    limit: int = Field(description="Starts per period.")
    period: float = Field(description="Seconds.")
    burst: int = Field(description="Starts allowed at once.")


class LimitValues(BaseModel):
    concurrency: int | None = Field(description="Jobs running at once (all workers); null: no limit.")
    rate: RateValue | None = Field(description="Starts per period (all workers); null: no limit.")
    partition_by: str | None = Field(description="Tasks: the argument whose each value has its own limits.")
    rate_text: str | None = Field(description="The rate as text, e.g. 50/s.")


class Limit(BaseModel):
    scope: str = Field(description="queue or task.")
    name: str
    queue: str | None = Field(description="The queue (a task's, from the tasks table; null if not known yet).")
    declared: LimitValues | None = Field(description="Declared in code (published by workers); null: none.")
    declared_by: str | None
    declared_at: datetime | None
    override: dict[str, Any] | None = Field(
        description="An operator's override: its keys (concurrency, rate) win over the declaration; null lifts one."
    )
    override_by: str | None
    override_at: datetime | None
    effective: LimitValues = Field(description="In force: the declaration with the override applied.")
    effective_text: str
    in_use: int = Field(description="Exact: concurrency slots in use (jobs running under a live lease).")
    partitions_in_use: int = Field(description="Exact: partitions of a partitioned task with slots in use.")
    held: int = Field(description="Exact: jobs of this queue or task held back by a limit.")
    held_for_slot: int = Field(description="Exact: of those, waiting for a concurrency slot.")
    held_for_rate: int = Field(description="Exact: of those, waiting for their rate reservation.")


class LimitOverride(BaseModel):
    """Fields left out keep their override; null lifts that limit (even one declared in code)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"concurrency": 5, "rate": "50/s"}]})

    concurrency: StrictInt | None = Field(default=None, description="Jobs running at once, 1-1000000; null: none.")
    rate: Any = Field(
        default=None,
        description="'50/s', '10/m', '100/h', '5/10s' or {limit, period (seconds), burst}; null: none.",
        json_schema_extra={"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}]},
    )


class QueueStats(BaseModel):
    queue: str
    paused: bool = Field(description="Exact.")
    backlog: int = Field(description="Exact: due jobs not yet published to Redis.")
    scheduled: int = Field(description="Exact: pending jobs whose run time is in the future.")
    queued: int = Field(description="Exact: published, waiting for a worker.")
    in_flight: int = Field(description="Exact: running.")
    retrying: int = Field(description="Exact: waiting for a retry.")
    dead: int = Field(description="Exact: dead letters not discarded.")
    discarded: int = Field(description="Exact: dead letters marked discarded.")
    oldest_waiting_seconds: float | None = Field(description="Exact: age of the oldest due, unstarted job.")
    in_streams: int | None = Field(description="Approximate: entries in the queue's Redis streams (XLEN).")
    stream_pending: int | None = Field(description="Approximate: entries delivered, not yet acknowledged (XPENDING).")
    redis_error: str | None = Field(description="Set when Redis could not be read (Redis numbers are null).")
    limits: list[Limit] = Field(
        default_factory=list, description="Flow-control limits of the queue and of its tasks (exact)."
    )
    fair: QueueFairness | None = Field(
        default=None, description="A fair queue's window and its five keys with the most waiting (null: not fair)."
    )


class QueueState(BaseModel):
    queue: str
    paused: bool
    updated_at: datetime


class FairnessDeclaration(BaseModel):
    """``PUT /api/v1/queues/{queue}/fairness``: serve the queue's jobs by an argument's values in turn."""

    model_config = ConfigDict(extra="forbid")
    by: str = Field(min_length=1, max_length=200, description="The argument whose value keys a job (tenant_id).")
    window: StrictInt | None = Field(
        default=None, ge=1, le=1_000_000, description="Jobs published and unfinished at most (null: the setting)."
    )


class FairKey(BaseModel):
    key: str
    waiting: int
    in_flight: int


class QueueFairness(BaseModel):
    queue: str
    by: str
    window: int | None = Field(description="As declared; null: POSTBOX_FAIR_WINDOW.")
    window_in_force: int
    in_flight: int
    waiting: int
    unkeyed: int = Field(description="Jobs enqueued since the relay last looked: not keyed yet.")
    keys: list[FairKey] = Field(description="The keys with the most jobs waiting first.")


class FairnessCleared(BaseModel):
    queue: str
    was_fair: bool


class Worker(BaseModel):
    id: str
    host: str | None = Field(description="null without the API key (docs/api.md, read access).")
    pid: int | None = Field(description="null without the API key.")
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen: datetime
    age_seconds: float = Field(description="Seconds since the last heartbeat.")
    in_flight: int
    processed: int
    failed: int
    stopped_at: datetime | None
    stopped: bool
    stale: bool = Field(description="Running, but no heartbeat for over 3 heartbeat intervals.")


class DeadSummary(JobSummary):
    discarded: bool


class DeadLetter(Job):
    discarded: bool


class DeadPage(BaseModel):
    items: list[DeadSummary]
    next_cursor: str | None


class RequeueResult(BaseModel):
    id: int
    queue: str
    task: str
    state: str
    attempts: int
    resumed: list[int] = Field(
        default_factory=list,
        description="A workflow's jobs that this job's death had cancelled, waiting for it again",
    )


class DiscardResult(BaseModel):
    id: int
    queue: str
    task: str
    state: str
    discarded_at: datetime


class PurgeResult(BaseModel):
    queue: str
    purged: int


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    checks: dict[str, str]


class AuditEntry(BaseModel):
    id: int
    at: datetime
    actor: str = Field(description="api:key, api:anonymous or cli:<os user>.")
    action: str = Field(description="job.cancel, queue.pause, queue.resume, dlq.requeue, dlq.discard, dlq.purge.")
    target: str = Field(description="job:<id> or queue:<name>.")
    request_id: str | None
    details: dict[str, Any]


class AuditPage(BaseModel):
    items: list[AuditEntry]
    next_cursor: str | None


class MoveRequest(BaseModel):
    """A new priority and/or run time for one waiting job (at least one of them)."""

    model_config = ConfigDict(extra="forbid")

    priority: int | None = Field(default=None, ge=0, le=9, description="The new priority, 0-9 (9 highest).")
    run_at: datetime | None = Field(default=None, description="Run at this time (timezone-aware).")
    delay_seconds: float | None = Field(default=None, ge=0, le=31_622_400, description="Run this long from now.")


class MoveManyRequest(MoveRequest):
    """The same change for the waiting jobs named by ``ids`` and/or matching the filter."""

    ids: list[int] | None = Field(default=None, min_length=1, max_length=1000, description="Jobs by id.")
    queue: str | None = Field(default=None, pattern=QUEUE_PATTERN, description="Only jobs of this queue.")
    task: str | None = Field(default=None, min_length=1, max_length=200, description="Only jobs of this task.")
    state: str | None = Field(default=None, description="Only jobs in this state: pending, queued or retrying.")
    limit: int = Field(default=1000, ge=1, le=10_000, description="Move at most this many (by id order).")


class MovedJob(BaseModel):
    id: int
    queue: str
    task: str
    state: str = Field(description="pending (a published job goes back through the outbox) or retrying.")
    priority: int
    available_at: datetime
    old_priority: int
    old_available_at: datetime
    was_published: bool = Field(description="It had an entry in its old stream: dropped, published again once.")


class MoveRefusal(BaseModel):
    id: int
    state: str | None = Field(description="The job's state; null when there is no such job.")
    reason: str


class MoveResult(BaseModel):
    moved: list[MovedJob]
    refused: list[MoveRefusal] = Field(description="Jobs named by id that did not move, each with the reason.")
    more: bool = Field(description="The filter moved `limit` jobs: there may be more, call again.")
