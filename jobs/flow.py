"""Flow control: global concurrency and rate limits, per queue, per task, per partition.

Declared in code (``@task(concurrency=3, rate="50/s", partition_by="customer_id")``,
:func:`postbox.limit_queue`), overridable at run time (``postbox.limits``, through the
API and the CLI). This module is the logic only: what a limit is, which keys a
job is counted under, and which of a batch of jobs may start now
(:func:`allocate`). The state lives in PostgreSQL and is read and written under
per-key locks by the worker's claim (``postbox.worker.flow``); see
docs/flow-control.md for the semantics and the fault behaviour.

Concurrency slots are leases: a slot counts while its job is running under a
live claim, so a crashed or frozen worker's slots come back when its leases
expire. Rates use the generic cell rate algorithm (GCRA): one timestamp per key,
the theoretical arrival time; starts are spaced ``period / limit`` apart, with
up to ``burst`` of them at once. Two cells per key: one hands out *tokens*
(a held-back job's reservation: the time it may start), the other spaces the
*starts* themselves, so a job that arrives after its reservation time (its
publish waited behind a backlog) still starts — its token is never lost — but
never in a clump with the starts around it.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from postbox.errors import InvalidOptionError

PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
# ``50/s``, ``5/10s``, ``3/1.5m``: a count, an optional multiple of the unit, the unit. Digits are
# bounded here (a count past MAX_LIMIT is refused by Rate with a clear message; a huge digit
# string would otherwise reach int()'s digit limit), and a multiple needs a digit ("." is none).
_RATE_RE = re.compile(r"^\s*(\d{1,30})\s*/\s*(\d{1,12}(?:\.\d{0,12})?|\.\d{1,12})?\s*([a-z]{1,10})\s*$")
MAX_LIMIT = 1_000_000
MAX_PARTITION_VALUE = 200  # characters of a partition key kept in the slot key (longer ones are hashed)

EARLY = 0.005  # a job may start this much before its time (clock rounding)


def _shown(value: Any) -> str:
    """``repr(value)`` for an error message, kept short (a 5,000-digit int cannot even be repr'd)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` starts per ``period`` seconds, spaced evenly; ``burst`` may start at once."""

    limit: int
    period: float = 1.0
    burst: int = 1

    def __post_init__(self) -> None:
        for name, value in (("limit", self.limit), ("burst", self.burst)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
                raise InvalidOptionError(
                    f"rate {name} must be an integer 1-{MAX_LIMIT}, got {_shown(value)}", field="rate"
                )
        if isinstance(self.period, bool) or not isinstance(self.period, int | float):
            raise InvalidOptionError(
                f"rate period must be a number of seconds, got {_shown(self.period)}", field="rate"
            )
        if not math.isfinite(self.period) or not 0.001 <= self.period <= 86_400 * 31:
            raise InvalidOptionError(f"rate period must be 0.001 s to 31 days, got {self.period!r}", field="rate")

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate."""
        return self.period / self.limit

    @property
    def tolerance(self) -> float:
        """How far ahead of the steady schedule a start may come (the burst)."""
        return (self.burst - 1) * self.interval

    @classmethod
    def parse(cls, value: Rate | str | Mapping[str, Any]) -> Rate:
        """``Rate``, ``"50/s"``, ``"10/m"``, ``"100/h"``, ``"5/10s"``, or ``{"limit", "period", "burst"}``."""
        if isinstance(value, Rate):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"limit", "period", "burst"}
            if unknown or "limit" not in value:
                raise InvalidOptionError(
                    f"a rate is {{'limit', 'period', 'burst'}}, got keys {sorted(value)}", field="rate"
                )
            period = value.get("period", 1.0)
            if isinstance(period, int) and not isinstance(period, bool):
                period = float(period)
            return cls(value["limit"], period, value.get("burst", 1))
        if isinstance(value, str) and len(value) <= 100:
            match = _RATE_RE.match(value.lower())
            if match and match.group(3) in PERIODS:
                count, multiple, unit = match.groups()
                return cls(int(count), float(multiple or 1) * PERIODS[unit])
        raise InvalidOptionError(
            f"invalid rate {_shown(value)}: write it as '50/s', '10/m', '100/h' or '5/10s'", field="rate"
        )

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "period": self.period, "burst": self.burst}

    def __str__(self) -> str:
        units = {1.0: "s", 60.0: "m", 3600.0: "h"}
        period = units.get(self.period) or f"{self.period:g}s"
        burst = f" (burst {self.burst})" if self.burst > 1 else ""
        return f"{self.limit}/{period}{burst}"


def check_concurrency(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise InvalidOptionError(
            f"concurrency must be an integer 1-{MAX_LIMIT}, got {_shown(value)}", field="concurrency"
        )
    return value


def check_partition_by(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,99}", value):
        raise InvalidOptionError(
            f"partition_by must name one argument of the task (an identifier), got {value!r}", field="partition_by"
        )
    return value


@dataclass(frozen=True, slots=True)
class FlowLimit:
    """The limits of one queue or one task. ``None`` fields: no such limit."""

    concurrency: int | None = None
    rate: Rate | None = None
    partition_by: str | None = None  # tasks only: each value of this argument has its own limits

    def __post_init__(self) -> None:
        check_concurrency(self.concurrency)
        check_partition_by(self.partition_by)

    @property
    def empty(self) -> bool:
        return self.concurrency is None and self.rate is None

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "rate": None if self.rate is None else self.rate.to_json(),
            "partition_by": self.partition_by,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> FlowLimit:
        if not data:
            return cls()
        rate = data.get("rate")
        return cls(
            concurrency=check_concurrency(data.get("concurrency")),
            rate=None if rate is None else Rate.parse(rate),
            partition_by=check_partition_by(data.get("partition_by")),
        )


OVERRIDABLE = ("concurrency", "rate")


def parse_override(data: Mapping[str, Any]) -> dict[str, Any]:
    """An operator's override: any of ``concurrency``, ``rate`` (``null`` lifts that limit).

    Returns its JSON form (rates normalised); raises :class:`InvalidOptionError`.
    """
    if not isinstance(data, Mapping) or not data:
        raise InvalidOptionError("an override sets at least one of: concurrency, rate", field="limits")
    unknown = sorted(set(data) - set(OVERRIDABLE))
    if unknown:
        raise InvalidOptionError(
            f"unknown limit {unknown[0]!r}: an override sets concurrency and/or rate", field=f"limits.{unknown[0]}"
        )
    out: dict[str, Any] = {}
    if "concurrency" in data:
        out["concurrency"] = check_concurrency(data["concurrency"])
    if "rate" in data:
        out["rate"] = None if data["rate"] is None else Rate.parse(data["rate"]).to_json()
    return out


def effective(declared: FlowLimit | None, override: Mapping[str, Any] | None) -> FlowLimit:
    """The limits in force: the declaration, with the override's fields winning."""
    base = declared or FlowLimit()
    if not override:
        return base
    changes: dict[str, Any] = {}
    if "concurrency" in override:
        changes["concurrency"] = override["concurrency"]
    if "rate" in override:
        changes["rate"] = None if override["rate"] is None else Rate.parse(override["rate"])
    return replace(base, **changes)


# --- keys ----------------------------------------------------------------------------


def queue_key(queue: str) -> str:
    return f"queue:{queue}"


def task_key(task: str, partition: str | None = None) -> str:
    return f"task:{task}" if partition is None else f"task:{task}|{partition}"


def partition_value(args_json: str, field_name: str) -> str:
    """The partition of a job: its argument's value as compact JSON (``null`` when absent)."""
    try:
        args = orjson.loads(args_json)
    except orjson.JSONDecodeError:
        args = {}
    value = args.get(field_name) if isinstance(args, dict) else None
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    if len(text) > MAX_PARTITION_VALUE:
        text = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


@dataclass(frozen=True, slots=True)
class JobKeys:
    """The keys one job is counted under."""

    concurrency: tuple[tuple[str, int], ...] = ()  # (key, limit)
    rate: tuple[tuple[str, Rate], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.concurrency or self.rate)


@dataclass
class Limits:
    """The limits a worker applies: per queue and per task (effective, overrides applied)."""

    queues: dict[str, FlowLimit] = field(default_factory=dict)
    tasks: dict[str, FlowLimit] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(not lim.empty for lim in self.queues.values()) or any(not lim.empty for lim in self.tasks.values())

    def limited(self, queue: str, task: str) -> bool:
        q = self.queues.get(queue)
        t = self.tasks.get(task)
        return (q is not None and not q.empty) or (t is not None and not t.empty)

    def keys(self, queue: str, task: str, args_json: str) -> JobKeys:
        conc: list[tuple[str, int]] = []
        rate: list[tuple[str, Rate]] = []
        q = self.queues.get(queue)
        if q is not None:
            if q.concurrency is not None:
                conc.append((queue_key(queue), q.concurrency))
            if q.rate is not None:
                rate.append((queue_key(queue), q.rate))
        t = self.tasks.get(task)
        if t is not None and not t.empty:
            part = None if t.partition_by is None else partition_value(args_json, t.partition_by)
            key = task_key(task, part)
            if t.concurrency is not None:
                conc.append((key, t.concurrency))
            if t.rate is not None:
                rate.append((key, t.rate))
        return JobKeys(tuple(conc), tuple(rate))


# --- allocation ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    job_id: int
    keys: JobKeys
    reserved_at: float | None = None  # a rate reservation made when it was held back (epoch seconds)


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int


@dataclass(frozen=True, slots=True)
class Park:
    """Every slot of ``key`` is taken: wait until one is released (or ``recheck`` passes)."""

    job_id: int
    key: str


@dataclass(frozen=True, slots=True)
class Reserve:
    """Publish again at ``at`` (epoch seconds), holding the rate token stamped ``token_at``.

    A new reservation has ``token_at == at``; a job that holds its token but must
    wait for the spacing of starts keeps its stamp and gets a later ``at``.
    """

    job_id: int
    at: float
    token_at: float


Decision = Start | Park | Reserve


@dataclass
class State:
    """What the claim read under the keys' locks: slots in use, rate cells, the database clock."""

    now: float
    used: dict[str, int] = field(default_factory=dict)
    tat: dict[str, float] = field(default_factory=dict)  # token cells: the next token's time
    stat: dict[str, float] = field(default_factory=dict)  # start cells: the next start's time
    changed: set[str] = field(default_factory=set)  # rate keys whose cells moved

    def cells(self, key: str) -> tuple[float, float]:
        """(token cell, start cell) of ``key``, as written back: an unset cell is ``now``."""
        return self.tat.get(key, self.now), self.stat.get(key, self.now)


def _conforms_at(
    cells: dict[str, float], keys: tuple[tuple[str, Rate], ...], now: float, *, slack: float = 0.0
) -> float:
    """The earliest time at which one more event conforms to every key's cell (GCRA).

    ``slack`` (a fraction of each key's interval) lets an event come that much
    ahead of the cell: the cell still moves by a whole interval, so the schedule
    does not drift; it only absorbs the jitter of a start that came a little late.
    """
    return max(max(max(cells.get(key, now), now) - rate.tolerance - slack * rate.interval for key, rate in keys), now)


START_SLACK = 0.5  # of an interval: how far a start may come ahead of the start cell
START_CATCH_UP = 1.0  # intervals of lateness through which the start cell keeps its schedule


def allocate(candidates: Sequence[Candidate], state: State) -> list[Decision]:
    """Decide, in order, which jobs start now; updates ``state`` (slots taken, rate cells moved).

    Concurrency is checked first: a job that waits for a slot spends no rate.
    Under a rate, a job without a token takes the next one: now if the key is
    idle, else a reservation (held back once, published at its time). A job
    holding a token starts when the spacing of starts allows — at once, unless
    jobs arriving late have just started — so tokens are never lost and starts
    are never closer than half an interval (beyond the burst); several late jobs
    in one batch are given start times an interval apart.
    """
    now = state.now
    out: list[Decision] = []
    spread: dict[str, float] = {}  # start times handed to late jobs of this batch (not written back)
    for cand in candidates:
        full = next((key for key, limit in cand.keys.concurrency if state.used.get(key, 0) >= limit), None)
        if full is not None:
            out.append(Park(cand.job_id, full))
            continue
        rates = cand.keys.rate
        if rates:
            token = cand.reserved_at
            if token is not None and token - EARLY > now:
                out.append(Reserve(cand.job_id, token, token))  # early (a reclaim): keep its time
                continue
            if token is None:
                token = _conforms_at(state.tat, rates, now)
                for key, rate in rates:
                    state.tat[key] = max(state.tat.get(key, now), token) + rate.interval
                    state.changed.add(key)
                if token > now + EARLY:
                    out.append(Reserve(cand.job_id, token, token))
                    continue
            cells = {key: max(state.stat.get(key, now), spread.get(key, now)) for key, _ in rates}
            start = _conforms_at(cells, rates, now, slack=START_SLACK)
            if start > now + EARLY:
                for key, rate in rates:
                    spread[key] = max(cells[key], now) + rate.interval
                out.append(Reserve(cand.job_id, start, token))
                continue
            for key, rate in rates:
                # On schedule, or late by up to an interval (its claim waited for the key's
                # lock, a busy machine): the schedule is kept, so lateness does not push every
                # later start back. Later than that (the key was idle): it starts afresh.
                prev = state.stat.get(key)
                on_time = prev is not None and prev >= now - START_CATCH_UP * rate.interval
                state.stat[key] = (prev if on_time and prev is not None else now) + rate.interval
                state.changed.add(key)
        for key, _ in cand.keys.concurrency:
            state.used[key] = state.used.get(key, 0) + 1
        out.append(Start(cand.job_id))
    return out


def describe_text(limit: FlowLimit) -> str:
    """``concurrency 3, rate 50/s, by customer_id``."""
    parts = []
    if limit.concurrency is not None:
        parts.append(f"concurrency {limit.concurrency}")
    if limit.rate is not None:
        parts.append(f"rate {limit.rate}")
    if limit.partition_by is not None:
        parts.append(f"per {limit.partition_by}")
    return ", ".join(parts) or "none"


def describe(limit: FlowLimit) -> dict[str, Any]:
    """A limit as the API shows it."""
    data = limit.to_json()
    data["rate_text"] = None if limit.rate is None else str(limit.rate)
    return data
