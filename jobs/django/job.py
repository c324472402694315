"""A job's transaction on Django's connection: a handler's Django ORM writes, exactly once.

``ctx.atomic()`` (what handlers write; :func:`atomic` here is the same) is
``transaction.atomic()`` around the body, plus the job's fence
(:class:`postbox.fence.JobFence`) on that connection: the processed row is
inserted first, the fenced success last, and Django commits them with the
body's writes, or rolls all of them back::

    @task()
    def credit(ctx, account_id: int) -> None:     # a sync handler: Django's ORM is sync
        with ctx.atomic():                        # using="default"
            Account.objects.filter(pk=account_id).update(balance=F("balance") + 10)

- An earlier run committed: :class:`~postbox.errors.AlreadyProcessed` on
  entering, the body does not run (the worker records a duplicate).
- The attempt is no longer the job's current one (another worker took it
  over): :class:`~postbox.fence.StaleAttempt` on leaving, everything rolls back.
- Any exception in the body: Django rolls back, the job is retried.

The block must be the outermost ``atomic()`` on its connection: a nested one
is a savepoint, which would not commit the success with the writes, so it is
refused. Nested ``atomic()`` blocks inside the body are savepoints as usual,
and ``transaction.on_commit()`` callbacks run after the job's commit. Around
the block the connection is closed if it is unusable or past ``CONN_MAX_AGE``,
as Django does around a request.

Django's ORM is sync: write the handler as a sync function (the worker runs it
on a thread). From an async handler, put the ORM work in a sync function and
call it through ``asgiref.sync.sync_to_async`` (Django's documented path); a
call made on the event loop itself is refused with an error that says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from postbox.errors import UnsupportedConnectionError
from postbox.sqlalchemy import FencedContext

__all__ = ["atomic"]


@contextmanager
def atomic(ctx: FencedContext, using: str | None = None) -> Iterator[None]:
    """The job's transaction on Django's database ``using`` (default: ``"default"``)."""
    _refuse_on_event_loop()
    from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

    alias = using or DEFAULT_DB_ALIAS
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise UnsupportedConnectionError(
            f"ctx.atomic(using={alias!r}) needs a PostgreSQL database, not {connection.vendor}"
        )
    # Django's TestCase wraps each test in atomic blocks of its own: inside those the
    # job's block is the test's outermost, as Django's durable=True check sees it.
    if any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
        raise RuntimeError(
            f"ctx.atomic(using={alias!r}) inside another atomic() block: it would be a savepoint, and the job's"
            " success would not commit with its writes; make it the outermost block"
        )
    take = getattr(ctx, "job_fence", None)
    if take is None:
        raise TypeError(f"{type(ctx).__name__} cannot run a job's transaction on Django's connection (no job_fence())")
    fence = take()
    connection.close_if_unusable_or_obsolete()
    try:
        with transaction.atomic(using=alias, durable=True):
            with connection.cursor() as cursor:
                cursor.execute(fence.begin_sql, fence.begin_params)
                row = cursor.fetchone()
            fence.check_fresh(row[0] if row is not None else None)
            yield
            if connection.needs_rollback:
                raise RuntimeError(
                    f"job {fence.job_id}: the job's transaction was marked for rollback inside ctx.atomic()"
                    " (an error caught inside a nested atomic block that did not roll back to its savepoint)"
                )
            try:
                with connection.cursor() as cursor:
                    cursor.execute(fence.success_sql, fence.success_params)
            except DatabaseError as exc:
                if fence.refused(exc):
                    raise fence.stale() from None
                raise
    finally:
        connection.close_if_unusable_or_obsolete()
    ctx.committed = True


def _refuse_on_event_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "ctx.atomic() runs Django's sync ORM and cannot run on the worker's event loop (an async handler):"
        " write the handler as a sync function (def) using `with ctx.atomic():`, or call a sync function"
        " that does through asgiref.sync.sync_to_async"
    )
