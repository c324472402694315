"""The job's fence: the two statements that make a handler's effects exactly once, on any connection.

A job's transaction, whoever opens it, is the same protocol around the body:

1. after ``BEGIN``, the processed row (``begin_processed(job)``, migration 0006):
   the job's id when fresh, NULL when an earlier run already committed its
   effects (:class:`~postbox.errors.AlreadyProcessed`: the body must not run);
2. the body's writes;
3. before ``COMMIT``, the success of this attempt (``record_success(job, worker,
   attempt)``), fenced: when the attempt is no longer the job's current one it
   raises SQLSTATE ``PB001`` (:data:`postbox.sql.STALE_ATTEMPT_SQLSTATE`), the
   transaction must roll back, and the run ends with :class:`StaleAttempt`.

A :class:`JobFence` holds what that takes for one run — the statements (in
DB-API ``%(name)s`` style and in SQLAlchemy's ``:name`` style), their
parameters, and how to read their results — and no connection: the worker's
own ``ctx.transaction()`` (``postbox.worker.context``) and the ORM adapters
(:mod:`postbox.sqlalchemy`, :mod:`postbox.django.job`) each run it on their own
connection, then mark the run committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, LiteralString

from postbox import sql
from postbox.errors import AlreadyProcessed


class StaleAttempt(BaseException):
    """This run's attempt is no longer the job's current one (the fence refused its outcome).

    Raised on leaving the job's transaction (``ctx.transaction()``,
    ``ctx.atomic()``): the transaction rolls back, so a stale run's effects never
    commit; the newer attempt does the work. A ``BaseException``, so a handler's
    ``except Exception`` does not swallow it.
    """


@dataclass(frozen=True, slots=True)
class JobFence:
    """The begin and success statements of one run of one job, with their parameters."""

    job_id: int
    worker_id: str
    attempt: int
    statements: sql.Statements = field(default_factory=sql.active, repr=False)

    # --- the statements -----------------------------------------------------------------

    @property
    def begin_sql(self) -> LiteralString:
        """The processed row, DB-API style (psycopg, psycopg2, Django cursors); one value: fresh or NULL."""
        return self.statements.PROCESSED_BEGIN

    @property
    def success_sql(self) -> LiteralString:
        """The fenced success, DB-API style; raises PB001 when the attempt is stale."""
        return self.statements.JOB_RECORD_SUCCESS

    @property
    def begin_sql_named(self) -> LiteralString:
        """:attr:`begin_sql` in SQLAlchemy's bind style (``text()``, any driver)."""
        return self.statements.PROCESSED_BEGIN_SQLALCHEMY

    @property
    def success_sql_named(self) -> LiteralString:
        """:attr:`success_sql` in SQLAlchemy's bind style."""
        return self.statements.JOB_RECORD_SUCCESS_SQLALCHEMY

    @property
    def begin_params(self) -> dict[str, Any]:
        return {"id": self.job_id}

    @property
    def success_params(self) -> dict[str, Any]:
        return {"id": self.job_id, "worker": self.worker_id, "attempt": self.attempt}

    # --- reading the results ------------------------------------------------------------

    def check_fresh(self, value: object) -> None:
        """Raise :class:`AlreadyProcessed` unless ``value`` (the begin statement's) says the row is fresh."""
        if value is None:
            raise AlreadyProcessed(f"job {self.job_id} already committed its effects")

    def refused(self, exc: BaseException) -> bool:
        """True when ``exc`` (a driver's error, or an ORM's wrapping one) is the fence refusing the success."""
        return sqlstate(exc) == sql.STALE_ATTEMPT_SQLSTATE

    def stale(self) -> StaleAttempt:
        return StaleAttempt(f"job {self.job_id}: attempt {self.attempt} is no longer current")


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error, looked for through the wrappers of ORMs and drivers.

    psycopg 3 and asyncpg name it ``sqlstate``, psycopg2 ``pgcode``; SQLAlchemy
    keeps the driver's error in ``orig``, Django chains it as ``__cause__``.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for attr in ("sqlstate", "pgcode"):
            code = getattr(current, attr, None)
            if isinstance(code, str) and code:
                return code
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None
