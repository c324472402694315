"""The schema revision this code needs, and the check every process makes at start.

A worker's statements call what the newest migrations created (migration 0006's
functions for ``ctx.transaction()``, 0007's version of its success, stamped at
commit time; the API reads 0008's dashboard sessions; 0009's triggers release a
workflow's jobs and ``ctx.upstream()`` reads its edges; a run writes 0010's
``outbox.progress`` and debounced tasks need its ``unique_claim()``; claims and
outcomes call 0013's functions; the relay's select of due rows, highest
priority first, needs 0021's index), so a worker started on a database that was not
migrated that far would fail such jobs or time them wrongly. It checks at start, and
refuses with :class:`postbox.errors.SchemaOutdatedError` instead; so do the
relay and ``api run``. A statement that meets a missing postbox table or
function later (the producer's enqueue, a relay whose schema was dropped) is
translated into the same error by :func:`missing_schema`.

A database *newer* than this code (a later postbox migrated it while older
workers still run: a rolling deploy) passes: migrations only add what older
code does not use. Revisions are ordered by their four-digit prefix
(``0006_job_transaction``); a unit test holds every migration to it and
:data:`REQUIRED` to the newest one.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import AsyncConnection, OperationalError

from postbox import schema, sql
from postbox.errors import SchemaOutdatedError

REQUIRED = "0021_publish_by_priority"


def order(revision: str) -> int | None:
    """The revision's place in the chain, from its four-digit prefix (None: not one of ours)."""
    prefix = revision[:4]
    return int(prefix) if len(revision) > 5 and prefix.isdigit() and revision[4] == "_" else None


def check(current: str | None, required: str = REQUIRED) -> None:
    """Raise :class:`SchemaOutdatedError` unless ``current`` is ``required`` or newer."""
    if current is None:
        raise SchemaOutdatedError(
            f"the database has no postbox schema (revision {required} needed): run `postbox migrate`"
        )
    place, needed = order(current), order(required)
    assert needed is not None, required
    if place is None:
        raise SchemaOutdatedError(
            f"the database's postbox schema is at an unknown revision {current!r} ({required} needed)"
        )
    if place < needed:
        raise SchemaOutdatedError(
            f"the database's postbox schema is at revision {current}; this postbox needs {required}:"
            " run `postbox migrate`"
        )


# What PostgreSQL answers when a statement names a schema, table, column or function it does not have.
MISSING_OBJECT = (
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
)


def missing_schema(exc: BaseException, schema_name: str | None = None) -> SchemaOutdatedError | None:
    """The :class:`SchemaOutdatedError` that ``exc`` means, when it is about one of postbox's own objects.

    ``relation "postbox.outbox" does not exist`` before ``postbox migrate``, or a
    function or column a later migration adds: the error to raise instead, which
    says to run ``postbox migrate``. ``None`` for anything else, such as the
    caller's own missing table in the same transaction.
    """
    if not isinstance(exc, MISSING_OBJECT):
        return None
    name = schema_name or schema.active()
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if f"{name}." not in text and f'"{name}"' not in text:
        return None
    return SchemaOutdatedError(
        f"the database's {name} schema is missing or older than this postbox ({text}): run `postbox migrate`"
    )


async def require(conn: Any) -> None:
    """Check the revision of the database behind ``conn`` (an async psycopg connection)."""
    check(await current(conn))


async def current(conn: Any) -> str | None:
    """The postbox revision of the database behind ``conn``; ``None`` when it has no postbox schema."""
    statements = sql.active()
    exists = await (await conn.execute(statements.MIGRATION_TABLE_EXISTS)).fetchone()
    row = await (await conn.execute(statements.MIGRATION_VERSION)).fetchone() if exists and exists[0] else None
    return str(row[0]) if row else None


async def require_at(database_url: str) -> None:
    """:func:`require` on a connection of its own, before a process writes anything.

    A database that cannot be reached is not checked here: the process waits for
    it as it does for any outage, and the worker checks again on its pool.
    """
    try:
        conn = await AsyncConnection.connect(database_url, autocommit=True, application_name="postbox-revision")
    except OperationalError:
        return
    async with conn:
        await require(conn)
