"""The connection a job is written on: psycopg 3's, or the one an ORM wraps.

``enqueue()`` joins the transaction already open on what it is given:

- a psycopg 3 ``Connection`` / ``AsyncConnection``: used as it is;
- a SQLAlchemy ``Session`` or ``Connection`` (``AsyncSession`` or
  ``AsyncConnection`` for the async twins): the DB-API connection of its
  current transaction (begun if none is, as SQLAlchemy's own statements would).
  On the psycopg dialect (``postgresql+psycopg://``) that is a psycopg
  connection, used as it is. On another driver (psycopg2, asyncpg, pg8000) the
  job, validated in Python as always, is written through SQLAlchemy by the SQL
  function ``postbox.enqueue()``, in the same transaction;
- Django's connection (``django.db.connection``): its psycopg 3 connection,
  or with psycopg2 the SQL function through a cursor of its own.

So a rollback of the ORM's transaction drops the job, and a commit publishes
it. Anything else is refused with :class:`UnsupportedConnectionError`.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from psycopg import AsyncConnection, Connection

from postbox import sql
from postbox.errors import UnsupportedConnectionError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session


class DjangoConnection(Protocol):
    """What postbox uses of ``django.db.connection`` (a PostgreSQL ``DatabaseWrapper``)."""

    vendor: str

    def ensure_connection(self) -> None: ...


# What enqueue() / enqueue_many() accept, and their async twins.
SyncTarget: TypeAlias = "Connection[Any] | Session | SAConnection | DjangoConnection"
AsyncTarget: TypeAlias = "AsyncConnection[Any] | AsyncSession | SAAsyncConnection"

# Writes one job (JobRow.params()) on a connection of another driver; returns its id.
Writer = Callable[[dict[str, Any]], int]
AsyncWriter = Callable[[dict[str, Any]], Awaitable[int]]

SUPPORTED = (
    "a psycopg 3 Connection, a SQLAlchemy Session or Connection, or Django's connection "
    "(AsyncConnection, AsyncSession or SQLAlchemy AsyncConnection for the async functions)"
)


def resolve(conn: object) -> Connection[Any] | Writer:
    """The psycopg connection behind ``conn``, or a writer through its own driver."""
    if isinstance(conn, Connection):
        return conn
    sa_conn = _sqlalchemy_connection(conn)
    if sa_conn is not None:
        driver = sa_conn.connection.driver_connection
        if isinstance(driver, Connection):
            return driver
        from sqlalchemy import text

        statement = text(sql.active().JOB_ENQUEUE_FUNCTION_SQLALCHEMY)
        return lambda params: int(sa_conn.execute(statement, params).scalar_one())
    wrapper = _django_wrapper(conn)
    if wrapper is not None:
        wrapper.ensure_connection()
        raw = wrapper.connection
        if isinstance(raw, Connection):
            return raw
        return lambda params: _dbapi_call(raw, params)
    if _is_async(conn):
        raise UnsupportedConnectionError(
            f"enqueue() needs a sync connection, not {_kind(conn)}: await enqueue_async() on it"
            " (or enqueue_many_async() for many jobs)"
        )
    raise UnsupportedConnectionError(f"enqueue() needs {SUPPORTED}, not {type(conn).__name__}")


async def resolve_async(conn: object) -> AsyncConnection[Any] | AsyncWriter:
    """The async twin of :func:`resolve`."""
    if isinstance(conn, AsyncConnection):
        return conn
    sa_conn = await _sqlalchemy_async_connection(conn)
    if sa_conn is not None:
        raw = await sa_conn.get_raw_connection()
        driver = raw.driver_connection
        if isinstance(driver, AsyncConnection):
            return driver
        from sqlalchemy import text

        statement = text(sql.active().JOB_ENQUEUE_FUNCTION_SQLALCHEMY)

        async def write(params: dict[str, Any]) -> int:
            return int((await sa_conn.execute(statement, params)).scalar_one())

        return write
    if _is_sync(conn):
        raise UnsupportedConnectionError(
            f"enqueue_async() needs an async connection, not {_kind(conn)}: call enqueue() on it"
            " (or enqueue_many() for many jobs)"
        )
    raise UnsupportedConnectionError(f"enqueue_async() needs {SUPPORTED}, not {type(conn).__name__}")


def _kind(conn: object) -> str:
    """``conn``'s class as its library names it: ``sqlalchemy AsyncSession``, ``psycopg AsyncConnection``."""
    cls = type(conn)
    return f"{cls.__module__.partition('.')[0]} {cls.__name__}"


def _is_async(conn: object) -> bool:
    """Whether ``conn`` is one of what :func:`resolve_async` accepts (no I/O)."""
    if isinstance(conn, AsyncConnection):
        return True
    if "sqlalchemy.ext.asyncio" not in sys.modules:
        return False
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession

    return isinstance(conn, AsyncSession | SAAsyncConnection)


def _is_sync(conn: object) -> bool:
    """Whether ``conn`` is one of what :func:`resolve` accepts (no I/O: a Session is not asked for its connection)."""
    if isinstance(conn, Connection) or _django_wrapper(conn) is not None:
        return True
    if "sqlalchemy" not in sys.modules:
        return False
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session

    return isinstance(conn, Session | SAConnection)


def _sqlalchemy_connection(conn: object) -> Any:
    """A SQLAlchemy Session's or Connection's Connection, or None (SQLAlchemy not even imported: None)."""
    if "sqlalchemy" not in sys.modules:
        return None
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session

    if isinstance(conn, Session):
        return conn.connection()
    if isinstance(conn, SAConnection):
        return conn
    return None


async def _sqlalchemy_async_connection(conn: object) -> Any:
    if "sqlalchemy.ext.asyncio" not in sys.modules:
        return None
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession

    if isinstance(conn, AsyncSession):
        return await conn.connection()
    if isinstance(conn, SAAsyncConnection):
        return conn
    return None


def _django_wrapper(conn: object) -> Any:
    """Django's PostgreSQL ``DatabaseWrapper`` behind ``conn`` (``django.db.connection`` is a proxy), or None."""
    if "django.db" not in sys.modules:
        return None
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.utils.connection import ConnectionProxy

    if isinstance(conn, ConnectionProxy):
        conn = conn._connections[conn._alias]
    if isinstance(conn, BaseDatabaseWrapper) and conn.vendor == "postgresql":
        return conn
    return None


def _dbapi_call(raw: Any, params: dict[str, Any]) -> int:
    cur = raw.cursor()
    try:
        cur.execute(sql.active().JOB_ENQUEUE_FUNCTION_PYFORMAT, params)
        return int(cur.fetchone()[0])
    finally:
        cur.close()
