"""Workflows: chains, groups and fan-ins of jobs, enqueued in the caller's transaction.

The declaration reads like Celery's canvas, which most Python users know::

    from postbox.workflow import chain, chord, group, enqueue_workflow

    flow = chain(fetch.s(url="..."), chord(group(resize.s(size=s) for s in (64, 256)), publish.s()))
    with conn.transaction():
        ids = enqueue_workflow(conn, flow, name="ingest")

``Task.s(...)`` (postbox.handle) binds every argument of a job (checked by the
type checker against the handler, as ``enqueue`` is): a job never receives its
upstream jobs' results as arguments; it reads them in its context
(``await ctx.upstream()``), so a handler's signature stays the one its
producers see. ``a | b`` is ``chain(a, b)``; ``chord(header, body)`` is
``chain(group(header), body)``.

:func:`plan` turns a declaration into jobs and edges (pure, unit-tested);
:func:`enqueue_workflow` validates every job first, then writes the workflow
row, its jobs (``waiting`` when they have upstream jobs), edges and join
counters with COPY on the caller's connection, in its transaction: the graph
exists if and only if that transaction commits. The release of dependents is
done by migration 0009's triggers in the statement that ends each job
(docs/workflows.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, Unpack, cast, get_args

import orjson
from psycopg import AsyncConnection, Connection

from postbox import connections, encryption, sql
from postbox.errors import EnqueueError, InvalidOptionError, UnsupportedConnectionError
from postbox.producer import EnqueueOptions, JobRow, Limits, _unmigrated, _unmigrated_async, prepare
from postbox.registry import Registry

if TYPE_CHECKING:
    from postbox.handle import Task

R = TypeVar("R")
Policy = Literal["cancel", "run", "record"]
POLICIES: tuple[str, ...] = get_args(Policy)
SHARDS = 16  # a job with more upstream jobs than this counts them in this many join rows (shards)
MAX_JOBS = 100_000
MAX_EDGES = 1_000_000
MAX_NAME = 200


class WorkflowError(EnqueueError):
    """A workflow that cannot be enqueued as declared (nothing was written)."""


# --- the declaration -----------------------------------------------------------------------------


class Canvas:
    """Something that can be a step of a workflow: a signature, a chain or a group."""

    def __or__(self, other: Canvas) -> Chain:
        return chain(self, other)

    def _flatten(self) -> list[Signature[Any]]:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Signature(Canvas, Generic[R]):
    """One job of a workflow: a task, its arguments bound, its options (``Task.s()`` builds it).

    ``on_failure`` is the policy of the edges into this job (None: the
    workflow's): what happens to it when one of its upstream jobs ends dead,
    cancelled or expired.
    """

    task: str
    args: dict[str, Any]
    options: EnqueueOptions = field(default_factory=lambda: cast(EnqueueOptions, {}))
    on_failure: Policy | None = None

    def on_upstream_failure(self, policy: Policy) -> Signature[R]:
        """This job with ``policy`` for its upstream jobs' failures: cancel, run or record."""
        _check_policy(policy)
        return Signature(self.task, self.args, self.options, policy)

    def set(self, **options: Unpack[EnqueueOptions]) -> Signature[R]:
        """This job with these enqueue options added (as ``Task.options()``)."""
        merged: EnqueueOptions = {**self.options}
        for name, value in options.items():
            if value is not None:
                merged[name] = value  # type: ignore[literal-required]
        return Signature(self.task, self.args, merged, self.on_failure)

    def _flatten(self) -> list[Signature[Any]]:
        return [self]

    def __repr__(self) -> str:
        return f"{self.task}.s({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"


@dataclass(frozen=True, eq=False)
class Chain(Canvas):
    """Steps one after the other: every job of a step waits for every last job of the step before."""

    steps: tuple[Canvas, ...]

    def _flatten(self) -> list[Signature[Any]]:
        return [s for step in self.steps for s in step._flatten()]


@dataclass(frozen=True, eq=False)
class Group(Canvas):
    """Steps side by side: they wait for nothing in common and run in parallel."""

    members: tuple[Canvas, ...]

    def _flatten(self) -> list[Signature[Any]]:
        return [s for member in self.members for s in member._flatten()]


def chain(*steps: Canvas) -> Chain:
    """``chain(a, b, c)``: b waits for a, c for b. A step may be a group (a fan-out, then a fan-in)."""
    flat: list[Canvas] = []
    for step in steps:
        _check_canvas(step)
        flat.extend(step.steps if isinstance(step, Chain) else (step,))
    if not flat:
        raise WorkflowError("a chain needs at least one step", field="workflow")
    return Chain(tuple(flat))


def group(*members: Canvas | Iterable[Canvas]) -> Group:
    """``group(a, b, c)`` or ``group(jobs)``: run in parallel."""
    flat: list[Canvas] = []
    for member in members:
        if isinstance(member, Canvas):
            flat.append(member)
        else:
            for item in member:
                _check_canvas(item)
                flat.append(item)
    if not flat:
        raise WorkflowError("a group needs at least one member", field="workflow")
    return Group(tuple(flat))


def chord(header: Canvas | Iterable[Canvas], body: Canvas) -> Chain:
    """``chord(group(...), callback)``: ``callback`` runs once every job of the header has ended."""
    return chain(header if isinstance(header, Canvas) else group(header), body)


def _check_canvas(value: object) -> None:
    if not isinstance(value, Canvas):
        raise WorkflowError(
            f"a workflow step must be a signature (task.s(...)), a chain or a group, not {type(value).__name__}",
            field="workflow",
        )


def _check_policy(policy: object) -> None:
    if policy not in POLICIES:
        raise InvalidOptionError(f"on_failure must be one of {', '.join(POLICIES)}, got {policy!r}", field="on_failure")


def signature(task: Task[Any, R], args: dict[str, Any]) -> Signature[R]:
    """The signature of ``task`` with these arguments (what ``Task.s`` returns)."""
    return Signature(task.name, args, cast(EnqueueOptions, {**task._options}))


# --- the plan: jobs and edges --------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    parent: int  # positions in Plan.jobs
    child: int
    on_failure: Policy


@dataclass(frozen=True)
class Plan:
    """A declaration as rows: its jobs in declaration order, and the edges between them."""

    jobs: tuple[Signature[Any], ...]
    edges: tuple[Edge, ...]

    def parents(self) -> list[list[int]]:
        """For each job, the positions of its upstream jobs, in edge order."""
        out: list[list[int]] = [[] for _ in self.jobs]
        for edge in self.edges:
            out[edge.child].append(edge.parent)
        return out

    def shards(self) -> list[int | None]:
        """Each edge's shard: None when its child counts its parents on its own row, else its position
        modulo the child's :func:`shard_count` (upstream jobs that run side by side land in different shards)."""
        seen: dict[int, int] = {}
        counts = [shard_count(len(p)) for p in self.parents()]
        out: list[int | None] = []
        for edge in self.edges:
            if counts[edge.child]:
                position = seen.get(edge.child, 0)
                seen[edge.child] = position + 1
                out.append(position % counts[edge.child])
            else:
                out.append(None)
        return out

    def waiting_on(self) -> list[int | None]:
        """Each job's initial counter: its parents (at most SHARDS), its shard count for a wide join, None for none."""
        return [None if not p else (shard_count(len(p)) or len(p)) for p in self.parents()]


def shard_count(parents: int) -> int:
    """How many join rows a job with ``parents`` upstream jobs counts them in (0: none, on its own row).

    At most SHARDS parents count on the job's row; a wider join in SHARDS rows.
    Measured (``postbox-bench workflow``): 64 or 512 shards made ``ctx.transaction()``
    children no faster, and made an outcome batch of no-op children update more
    rows (a batch touches each shard it counts down once), so 16 it is.
    """
    return 0 if parents <= SHARDS else SHARDS


def plan(canvas: Canvas, on_failure: Policy = "cancel") -> Plan:
    """The jobs and edges of ``canvas``; each edge takes its child's policy, else ``on_failure``."""
    _check_canvas(canvas)
    _check_policy(on_failure)
    jobs: list[Signature[Any]] = []
    index: dict[int, int] = {}
    edges: list[tuple[int, int]] = []

    def walk(node: Canvas) -> tuple[list[int], list[int]]:
        """Add ``node``'s jobs and inner edges; return its first jobs (heads) and last jobs (tails)."""
        if isinstance(node, Signature):
            if id(node) in index:
                raise WorkflowError(
                    f"the signature {node!r} appears twice in the workflow: make one per job", field="workflow"
                )
            index[id(node)] = len(jobs)
            jobs.append(node)
            if len(jobs) > MAX_JOBS:
                raise WorkflowError(f"a workflow holds at most {MAX_JOBS} jobs", field="workflow")
            return [index[id(node)]], [index[id(node)]]
        if isinstance(node, Group):
            heads: list[int] = []
            tails: list[int] = []
            for member in node.members:
                h, t = walk(member)
                heads += h
                tails += t
            return heads, tails
        assert isinstance(node, Chain)
        first: list[int] | None = None
        previous: list[int] = []
        for step in node.steps:
            h, t = walk(step)
            if first is None:
                first = h
            else:
                if len(edges) + len(previous) * len(h) > MAX_EDGES:
                    raise WorkflowError(
                        f"a workflow holds at most {MAX_EDGES} dependencies: put a single job between two wide groups",
                        field="workflow",
                    )
                edges.extend((p, c) for c in h for p in previous)
            previous = t
        assert first is not None
        return first, previous

    walk(canvas)
    return Plan(
        tuple(jobs),
        tuple(Edge(p, c, jobs[c].on_failure or on_failure) for p, c in edges),
    )


# --- enqueue -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowIds:
    """What :func:`enqueue_workflow` returns: the workflow's id and its jobs' ids in declaration order."""

    id: int
    jobs: tuple[int, ...]

    def __int__(self) -> int:
        return self.id


def prepare_workflow(
    canvas: Canvas,
    *,
    name: str | None = None,
    on_failure: Policy = "cancel",
    registry: Registry | None = None,
    limits: Limits | None = None,
) -> tuple[Plan, list[JobRow], str]:
    """Validate every job of ``canvas`` (typed errors, nothing written): its plan, rows and name."""
    workflow_plan = plan(canvas, on_failure)
    rows = []
    for position, sig in enumerate(workflow_plan.jobs):
        try:
            row = prepare(sig.task, sig.args, registry=registry, limits=limits, **sig.options)
        except EnqueueError as exc:
            raise type(exc)(f"job {position} of the workflow ({sig.task}): {exc}", field=exc.field) from None
        if row.dedup_key is not None or row.unique_rule is not None:
            raise WorkflowError(
                f"job {position} of the workflow ({sig.task}) has a dedup key or a uniqueness rule: a workflow's"
                " jobs are always created, never deduplicated",
                field="dedup_key",
            )
        rows.append(row)
    label = name if name is not None else (workflow_plan.jobs[0].task if len(workflow_plan.jobs) else "workflow")
    if not isinstance(label, str) or not 0 < len(label) <= MAX_NAME:
        raise WorkflowError(f"a workflow's name must be a string of 1-{MAX_NAME} characters", field="name")
    return workflow_plan, rows, label


def _copy_jobs(
    rows: Sequence[JobRow], ids: Sequence[tuple[int, Any]], workflow_id: int, waiting: Sequence[int | None]
) -> Iterable[tuple[Any, ...]]:
    now = ids[0][1]
    for (job_id, _), row, count in zip(ids, rows, waiting, strict=True):
        available = row.run_at if row.run_at is not None else now + timedelta(seconds=row.delay)
        yield (
            job_id, row.queue, row.task, row.args, row.priority, available, row.max_attempts, row.headers,
            row.expires_at, row.timeout, row.keep_result, workflow_id,
            "pending" if count is None else "waiting", count,
        )  # fmt: skip


def _copy_edges(workflow_plan: Plan, ids: Sequence[int], workflow_id: int) -> Iterable[tuple[Any, ...]]:
    for edge, shard in zip(workflow_plan.edges, workflow_plan.shards(), strict=True):
        yield ids[edge.parent], ids[edge.child], workflow_id, shard, edge.on_failure


def _copy_joins(workflow_plan: Plan, ids: Sequence[int]) -> Iterable[tuple[Any, ...]]:
    counts: dict[tuple[int, int], int] = {}
    for edge, shard in zip(workflow_plan.edges, workflow_plan.shards(), strict=True):
        if shard is not None:
            key = (ids[edge.child], shard)
            counts[key] = counts.get(key, 0) + 1
    for (job_id, shard), n in sorted(counts.items()):
        yield job_id, shard, n


@_unmigrated
def enqueue_workflow(
    conn: Any,
    canvas: Canvas,
    *,
    name: str | None = None,
    on_failure: Policy = "cancel",
    registry: Registry | None = None,
    limits: Limits | None = None,
) -> WorkflowIds:
    """Insert a workflow in ``conn``'s current transaction (never commits); its id and its jobs' ids.

    ``conn``: a psycopg 3 connection, or a SQLAlchemy session/connection or
    Django's connection on psycopg 3. ``on_failure`` is the policy of every
    dependency whose job does not say (``Signature.on_upstream_failure``).
    """
    workflow_plan, rows, label = prepare_workflow(
        canvas, name=name, on_failure=on_failure, registry=registry, limits=limits
    )
    if not isinstance(conn, Connection):
        target = connections.resolve(conn)
        if not isinstance(target, Connection):
            raise UnsupportedConnectionError("enqueue_workflow() needs a connection on psycopg 3")
        conn = target
    statements = sql.active()
    waiting = workflow_plan.waiting_on()
    with conn.cursor() as cur:
        row = cur.execute(
            statements.WORKFLOW_INSERT, {"name": label, "on_failure": on_failure, "jobs": len(rows)}
        ).fetchone()
        assert row is not None
        workflow_id = int(row[0])
        drawn = sorted(cur.execute(statements.JOB_NEXT_IDS, {"n": len(rows)}).fetchall())
        ids = [job_id for job_id, _ in drawn]
        with cur.copy(statements.JOB_COPY_OF_WORKFLOW) as copy:
            for values in _copy_jobs(rows, drawn, workflow_id, waiting):
                copy.write_row(values)
        if workflow_plan.edges:
            with cur.copy(statements.WORKFLOW_EDGE_COPY) as copy:
                for values in _copy_edges(workflow_plan, ids, workflow_id):
                    copy.write_row(values)
            joins = list(_copy_joins(workflow_plan, ids))
            if joins:
                with cur.copy(statements.WORKFLOW_JOIN_COPY) as copy:
                    for values in joins:
                        copy.write_row(values)
    return WorkflowIds(workflow_id, tuple(ids))


@_unmigrated_async
async def enqueue_workflow_async(
    conn: Any,
    canvas: Canvas,
    *,
    name: str | None = None,
    on_failure: Policy = "cancel",
    registry: Registry | None = None,
    limits: Limits | None = None,
) -> WorkflowIds:
    """The async twin of :func:`enqueue_workflow` (a psycopg ``AsyncConnection`` or SQLAlchemy's async objects)."""
    workflow_plan, rows, label = prepare_workflow(
        canvas, name=name, on_failure=on_failure, registry=registry, limits=limits
    )
    if not isinstance(conn, AsyncConnection):
        target = await connections.resolve_async(conn)
        if not isinstance(target, AsyncConnection):
            raise UnsupportedConnectionError("enqueue_workflow_async() needs a connection on psycopg 3")
        conn = target
    statements = sql.active()
    waiting = workflow_plan.waiting_on()
    async with conn.cursor() as cur:
        await cur.execute(statements.WORKFLOW_INSERT, {"name": label, "on_failure": on_failure, "jobs": len(rows)})
        row = await cur.fetchone()
        assert row is not None
        workflow_id = int(row[0])
        await cur.execute(statements.JOB_NEXT_IDS, {"n": len(rows)})
        drawn = sorted(await cur.fetchall())
        ids = [job_id for job_id, _ in drawn]
        async with cur.copy(statements.JOB_COPY_OF_WORKFLOW) as copy:
            for values in _copy_jobs(rows, drawn, workflow_id, waiting):
                await copy.write_row(values)
        if workflow_plan.edges:
            async with cur.copy(statements.WORKFLOW_EDGE_COPY) as copy:
                for values in _copy_edges(workflow_plan, ids, workflow_id):
                    await copy.write_row(values)
            joins = list(_copy_joins(workflow_plan, ids))
            if joins:
                async with cur.copy(statements.WORKFLOW_JOIN_COPY) as copy:
                    for values in joins:
                        await copy.write_row(values)
    return WorkflowIds(workflow_id, tuple(ids))


# --- downstream: what a job reads of its upstream jobs ---------------------------------------------


@dataclass(frozen=True)
class UpstreamJob:
    """One upstream job of the running job, as it ended."""

    id: int
    task: str
    state: str  # succeeded, dead, cancelled or expired (every upstream job has ended when its dependent runs)
    result: Any  # its kept result (JSON), None when it keeps none or did not succeed
    error_class: str | None
    error: str | None
    on_failure: Policy  # the policy of the edge to the running job
    failure: dict[str, Any] | None  # 'record' edges: the failure as written when the upstream job ended


@dataclass(frozen=True)
class Upstream:
    """What ``await ctx.upstream()`` returns: the running job's upstream jobs, by id."""

    jobs: tuple[UpstreamJob, ...]

    def results(self, task: Task[Any, R] | None = None) -> list[R]:
        """The kept results of the upstream jobs that succeeded (of ``task`` only, typed by its handler)."""
        name = task.name if task is not None else None
        return [
            cast(R, job.result) for job in self.jobs if job.state == "succeeded" and (name is None or job.task == name)
        ]

    def result(self, task: Task[Any, R]) -> R:
        """The one kept result of ``task`` upstream (LookupError unless exactly one succeeded)."""
        found = self.results(task)
        if len(found) != 1:
            raise LookupError(f"{len(found)} succeeded upstream jobs of task {task.name!r}, expected 1")
        return found[0]

    def failures(self) -> list[UpstreamJob]:
        """The upstream jobs that failed on edges that record failures (policy 'record')."""
        return [job for job in self.jobs if job.failure is not None]


RESULT_WAIT = 10.0  # seconds a job waits for a ctx.transaction() upstream job's result still being written


def _kept(job_id: int, result: str | None) -> Any:
    """An upstream job's kept result; an encrypted task's opened with this worker's key (postbox.encryption)."""
    return None if result is None else encryption.open_result(job_id, orjson.loads(result))


async def read_upstream(conn: AsyncConnection[Any], job_id: int, *, wait: float = RESULT_WAIT) -> Upstream:
    """The upstream jobs of ``job_id``, on ``conn`` (autocommit).

    A ``ctx.transaction()`` job's kept result is written just after the commit
    that released this job: for up to ``wait`` seconds, this waits for such
    results of upstream jobs that ended in the last minute.
    """
    statements = sql.active()
    deadline = time.monotonic() + wait
    while True:
        cur = await conn.execute(statements.WORKFLOW_COUNT_RESULTS_UNWRITTEN, {"id": job_id, "within": 60.0})
        row = await cur.fetchone()
        if not row or not row[0] or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.05)
    cur = await conn.execute(statements.WORKFLOW_EDGE_LIST_UPSTREAM, {"id": job_id})
    jobs = []
    for jid, task, state, _keep, result, error_class, error, policy, failure in await cur.fetchall():
        jobs.append(
            UpstreamJob(
                id=jid,
                task=task,
                state=state,
                result=_kept(jid, result) if state == "succeeded" else None,
                error_class=error_class if state != "succeeded" else None,
                error=error if state != "succeeded" else None,
                on_failure=policy,
                failure=orjson.loads(failure) if failure is not None else None,
            )
        )
    return Upstream(tuple(jobs))


# --- a dead letter requeued ---------------------------------------------------------------------

FAILED_STATES = frozenset({"dead", "cancelled", "expired"})


@dataclass(frozen=True)
class InboundEdge:
    """An edge into a job that the death of a requeued job cancelled: its parent, policy and state."""

    child: int
    parent: int
    on_failure: str
    parent_state: str


def resumable(requeued: int, edges: Iterable[InboundEdge]) -> list[int]:
    """The jobs that wait again when the dead job ``requeued`` goes back to the outbox.

    ``edges``: every edge into each job its death cancelled, down a chain of such
    cancels. Such a job is resumed unless one of its ``cancel`` edges comes from a
    parent that failed (dead, cancelled or expired) and is not resumed itself: that
    failure still cancels it, and a job waiting on a parent that will never end
    again would wait forever. Dropping one job can doom the jobs below it, so the
    rule is applied until nothing changes. Returns the ids in order.
    """
    inbound: dict[int, list[InboundEdge]] = {}
    for edge in edges:
        inbound.setdefault(edge.child, []).append(edge)
    kept = set(inbound)
    changed = True
    while changed:
        changed = False
        for child in sorted(kept):
            blocked = any(
                e.on_failure == "cancel"
                and e.parent_state in FAILED_STATES
                and e.parent != requeued
                and e.parent not in kept
                for e in inbound[child]
            )
            if blocked:
                kept.discard(child)
                changed = True
    return sorted(kept)
