"""enqueue() joins the ORM's transaction: SQLAlchemy (sync and async; psycopg, psycopg2, asyncpg) and Django.

Commit → the job exists; rollback → it never did. On a driver other than
psycopg 3 the job goes through the SQL function, with every option applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from postbox import connections, enqueue, enqueue_async, enqueue_many, enqueue_many_async
from postbox.errors import UnsupportedConnectionError
from tests.harness.tasks import core as tasks_core

ROOT = Path(__file__).resolve().parents[2]
JOBS = "SELECT task, queue, priority, args->>'user_id', headers->>'trace', available_at > now() FROM postbox.outbox"


def url_for(database_url: str, driver: str) -> str:
    return f"postgresql+{driver}://" + database_url.split("://", 1)[1]


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(JOBS + " ORDER BY id").fetchall()


@pytest.fixture
def business(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE public.signups (id serial PRIMARY KEY, email text NOT NULL)")
    conn.commit()
    return conn


@pytest.fixture(params=["psycopg", "psycopg2"])
def engine(request: pytest.FixtureRequest, database_url: str) -> Iterator[Engine]:
    eng = create_engine(url_for(database_url, request.param))
    yield eng
    eng.dispose()


def test_session_commit_and_rollback(engine: Engine, business: psycopg.Connection[Any]) -> None:
    with Session(engine) as session:
        session.execute(text("INSERT INTO signups (email) VALUES ('a@example.org')"))
        first = enqueue(session, tasks_core.send_welcome, {"user_id": 1}, priority=8, headers={"trace": "t-1"})
        session.commit()
    with Session(engine) as session:
        session.execute(text("INSERT INTO signups (email) VALUES ('b@example.org')"))
        enqueue(session, tasks_core.send_welcome, {"user_id": 2})
        session.rollback()
    with Session(engine) as session, session.begin():  # a Connection of the session, in its transaction
        delayed = enqueue(session.connection(), "send_welcome", {"user_id": 3}, queue="later", delay=600)
    assert isinstance(first, int) and delayed > first
    assert jobs(business) == [
        ("send_welcome", "mail", 8, "1", "t-1", False),
        ("send_welcome", "later", 7, "3", None, True),
    ]
    assert business.execute("SELECT email FROM signups ORDER BY id").fetchall() == [("a@example.org",)]


def test_engine_connection_and_bulk(engine: Engine, business: psycopg.Connection[Any]) -> None:
    with engine.begin() as sa_conn:
        ids = enqueue_many(sa_conn, [{"task": "send_welcome", "args": {"user_id": i}} for i in range(3)])
        again = enqueue(sa_conn, tasks_core.noop, dedup_key="once")
        assert enqueue(sa_conn, tasks_core.noop, dedup_key="once") == again
    with pytest.raises(RuntimeError), engine.begin() as sa_conn:
        enqueue_many(sa_conn, [{"task": "noop"}] * 2)
        raise RuntimeError("the business logic failed")
    assert len(ids) == 3 and ids == sorted(ids)
    assert [row[0] for row in jobs(business)] == ["send_welcome"] * 3 + ["noop"]


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_async_session_commit_and_rollback(
    driver: str, database_url: str, business: psycopg.Connection[Any]
) -> None:
    eng = create_async_engine(url_for(database_url, driver))
    try:
        async with AsyncSession(eng) as session:
            await session.execute(text("INSERT INTO signups (email) VALUES ('a@example.org')"))
            await enqueue_async(session, tasks_core.send_welcome, {"user_id": 1}, headers={"trace": "x"})
            await enqueue_many_async(session, [{"task": "noop", "priority": 9}])
            await session.commit()
        async with AsyncSession(eng) as session:
            await enqueue_async(session, tasks_core.send_welcome, {"user_id": 2})
            await session.rollback()
        async with eng.begin() as sa_conn:
            await enqueue_async(sa_conn, tasks_core.send_welcome, {"user_id": 3}, delay=600)
    finally:
        await eng.dispose()
    assert jobs(business) == [
        ("send_welcome", "mail", 7, "1", "x", False),
        ("noop", "default", 9, None, None, False),
        ("send_welcome", "mail", 7, "3", None, True),
    ]


def test_psycopg2_dbapi_path(database_url: str, business: psycopg.Connection[Any]) -> None:
    """What Django on psycopg2 uses: the SQL function through a DB-API cursor, in its transaction."""
    import psycopg2

    raw = psycopg2.connect(database_url)
    try:
        params = enqueue_params(tasks_core.send_welcome, {"user_id": 5}, priority=2)
        job = connections._dbapi_call(raw, params)
        raw.rollback()
        assert jobs(business) == []
        job = connections._dbapi_call(raw, params)
        raw.commit()
    finally:
        raw.close()
    assert business.execute("SELECT id, priority FROM postbox.outbox").fetchall() == [(job, 2)]


def enqueue_params(task: Any, args: dict[str, Any], **options: Any) -> dict[str, Any]:
    from postbox.producer import prepare

    return prepare(task, args, **options).params()


def test_what_cannot_carry_a_job_is_refused(business: psycopg.Connection[Any]) -> None:
    with pytest.raises(UnsupportedConnectionError, match="not dict"):
        enqueue({}, tasks_core.noop)  # type: ignore[arg-type]
    assert jobs(business) == []


DJANGO_SCRIPT = """
import json, sys
import django
from django.conf import settings

settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": sys.argv[1], "USER": sys.argv[2],
                           "HOST": sys.argv[3], "PORT": sys.argv[4]}},
    INSTALLED_APPS=[], USE_TZ=True,
)
django.setup()
from django.db import connection, transaction

from postbox import enqueue
from tests.harness.tasks import core as tasks_core

with transaction.atomic():
    with connection.cursor() as cur:
        cur.execute("INSERT INTO signups (email) VALUES ('django@example.org')")
    kept = enqueue(connection, tasks_core.send_welcome, {"user_id": 7}, priority=6)
try:
    with transaction.atomic():
        enqueue(connection, tasks_core.send_welcome, {"user_id": 8})
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
print(json.dumps({"kept": kept, "driver": type(connection.connection).__module__.split(".")[0]}))
"""


def test_django_connection_in_atomic_blocks(database_url: str, business: psycopg.Connection[Any]) -> None:
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    argv = [str(info.get(k, "")) for k in ("dbname", "user", "host", "port")]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DJANGO_SCRIPT), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["driver"] == "psycopg"
    assert business.execute("SELECT id, args->>'user_id', priority FROM postbox.outbox").fetchall() == [
        (out["kept"], "7", 6)
    ]
    assert business.execute("SELECT email FROM signups").fetchall() == [("django@example.org",)]
