"""Retention: delete what is past its keep-by date, in small batches.

Three kinds of rows, each pruned by its own statement (``postbox.sql`` retention):

- ``finished``: outbox rows in succeeded, cancelled or expired whose
  ``finished_at`` is older than ``retention_finished_days``; their
  ``job_attempts`` go with them (in the same statement), and so do their results
  and dedup keys. Dead letters are never pruned here: they stay until an
  operator discards and purges them (``postbox dlq purge``).
- ``processed``: ``processed_jobs`` markers older than
  ``retention_processed_days`` whose job is finished for good or gone.
- ``results``: results past their own ``result_expires_at`` are cleared on the
  rows that are kept.
- ``limits``: flow-control state that no longer counts: slots whose job no longer
  runs under a live claim (a worker died before releasing them) and rate cells
  whose time has passed (an absent cell means the same). docs/flow-control.md.

Every batch (``prune_batch_size`` rows, ``FOR UPDATE SKIP LOCKED``) is its own
short transaction, so producers, workers and the relay are never held up by a
long delete. Call it with a connection outside any transaction. ``now`` pins
the clock (tests); production leaves it None and the database's ``now()`` is used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, LiteralString

from psycopg import AsyncConnection, Connection
from psycopg.pq import TransactionStatus

from postbox import sql
from postbox.cancellation import cancel_all
from postbox.settings import Settings

SECONDS_PER_DAY = 86_400.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One kind of row to prune: its delete and its dry-run count."""

    kind: str
    delete: LiteralString
    count: LiteralString
    age_seconds: float | None  # None: the statement compares with now() itself


def steps(settings: Settings) -> list[Step]:
    """What a prune does, in order, for these settings."""
    return [
        Step(
            "finished",
            sql.active().JOB_DELETE_FINISHED,
            sql.active().JOB_COUNT_FINISHED,
            settings.retention_finished_days * SECONDS_PER_DAY,
        ),
        Step(
            "processed",
            sql.active().PROCESSED_DELETE_OLD,
            sql.active().PROCESSED_COUNT_OLD,
            settings.retention_processed_days * SECONDS_PER_DAY,
        ),
        Step("results", sql.active().JOB_CLEAR_EXPIRED_RESULTS, sql.active().JOB_COUNT_EXPIRED_RESULTS, None),
        Step("limits", sql.active().LIMIT_DELETE_DEAD_STATE, sql.active().LIMIT_COUNT_DEAD_STATE, None),
    ]


@dataclass
class PruneReport:
    """What a prune removed (or, with dry_run, would remove)."""

    dry_run: bool = False
    finished: int = 0  # outbox rows deleted (with their attempts and results)
    processed: int = 0  # processed_jobs rows deleted
    results: int = 0  # results cleared on kept rows
    limits: int = 0  # flow-control state that no longer counts (dead slots, rate cells in the past)
    batches: list[tuple[str, int]] = field(default_factory=list)  # (kind, rows) per committed batch
    complete: bool = True  # False when max_batches stopped it before the end

    @property
    def total(self) -> int:
        return self.finished + self.processed + self.results + self.limits

    def add(self, kind: str, rows: int) -> None:
        setattr(self, kind, getattr(self, kind) + rows)

    def batch_done(self, kind: str, rows: int, limit: int, on_batch: Callable[[str, int], None] | None) -> bool:
        """Record one committed batch; True while the step may have more rows."""
        if rows == 0:
            return False
        self.add(kind, rows)
        self.batches.append((kind, rows))
        if on_batch is not None:
            on_batch(kind, rows)
        return rows >= limit

    def out_of_batches(self, max_batches: int | None) -> bool:
        """True (and the report marked incomplete) once ``max_batches`` were used."""
        if max_batches is not None and len(self.batches) >= max_batches:
            self.complete = False
            return True
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "finished": self.finished,
            "processed": self.processed,
            "results": self.results,
            "limits": self.limits,
            "batches": len(self.batches),
            "complete": self.complete,
        }


def _params(step: Step, now: datetime | None, limit: int) -> dict[str, Any]:
    return {"now": now, "age": step.age_seconds, "limit": limit}


def _check_idle(status: TransactionStatus) -> None:
    if status != TransactionStatus.IDLE:
        raise ValueError("prune needs a connection outside any transaction: each batch commits on its own")


def prune(
    conn: Connection[Any],
    settings: Settings,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    max_batches: int | None = None,
    on_batch: Callable[[str, int], None] | None = None,
) -> PruneReport:
    """Prune on a sync connection; see the module doc.

    ``max_batches`` bounds the work of one call (a periodic duty); the report's
    ``complete`` says whether everything due was removed. ``on_batch`` is a test
    hook, called after each committed batch.
    """
    _check_idle(conn.info.transaction_status)
    report = PruneReport(dry_run=dry_run)
    limit = settings.prune_batch_size
    for step in steps(settings):
        params = _params(step, now, limit)
        if dry_run:
            row = conn.execute(step.count, params).fetchone()
            conn.commit()
            report.add(step.kind, int(row[0]) if row else 0)
            continue
        while True:
            if report.out_of_batches(max_batches):
                return report
            with conn.transaction():
                rows = len(conn.execute(step.delete, params).fetchall())
            if not report.batch_done(step.kind, rows, limit, on_batch):
                break
    return report


async def prune_async(
    conn: AsyncConnection[Any],
    settings: Settings,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    max_batches: int | None = None,
    on_batch: Callable[[str, int], None] | None = None,
) -> PruneReport:
    """:func:`prune` on an async connection (for the relay's periodic duty)."""
    _check_idle(conn.info.transaction_status)
    report = PruneReport(dry_run=dry_run)
    limit = settings.prune_batch_size
    for step in steps(settings):
        params = _params(step, now, limit)
        if dry_run:
            cur = await conn.execute(step.count, params)
            row = await cur.fetchone()
            await conn.commit()
            report.add(step.kind, int(row[0]) if row else 0)
            continue
        while True:
            if report.out_of_batches(max_batches):
                return report
            async with conn.transaction():
                cur = await conn.execute(step.delete, params)
                rows = len(await cur.fetchall())
            if not report.batch_done(step.kind, rows, limit, on_batch):
                break
    return report


class PruneDuty:
    """Periodic pruning for a long-running process (the leading relay).

    Call :meth:`kick` from the process's loop as often as you like: when
    ``prune_interval`` has passed since the last round and no round is running,
    it starts one in the background on a connection of its own (never the
    caller's session), bounded to ``max_batches`` batches. :meth:`stop` cancels
    a running round (e.g. when leadership is lost). ``prune_interval = 0`` turns
    it off. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        settings: Settings,
        database_url: str,
        *,
        max_batches: int = 50,
        clock: Callable[[], float] = time.monotonic,
        on_report: Callable[[PruneReport], None] | None = None,
    ) -> None:
        self.settings = settings
        self.database_url = database_url
        self.max_batches = max_batches
        self.clock = clock
        self.on_report = on_report
        self.next_at = clock()  # the first kick runs a round
        self.task: asyncio.Task[PruneReport] | None = None
        self.last: PruneReport | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.prune_interval > 0

    def kick(self) -> bool:
        """Start a round if one is due; True if it did."""
        if not self.enabled or (self.task is not None and not self.task.done()):
            return False
        now = self.clock()
        if now < self.next_at:
            return False
        self.next_at = now + self.settings.prune_interval
        self.task = asyncio.get_running_loop().create_task(self._round(), name="postbox-prune")
        return True

    async def _round(self) -> PruneReport:
        try:
            conn = await AsyncConnection.connect(self.database_url, autocommit=True, application_name="postbox-prune")
            try:
                report = await prune_async(conn, self.settings, max_batches=self.max_batches)
            finally:
                await conn.close()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed round is retried at the next interval
            log.warning("pruning failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            raise
        self.last = report
        if report.total:
            log.info("pruned", extra=report.as_dict())
        if self.on_report is not None:
            self.on_report(report)
        return report

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            await cancel_all([task])  # a round's connect or statement can lose one cancel
