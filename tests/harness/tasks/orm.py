"""Handlers that write their effects through an ORM inside the job's transaction (queue ``orm``).

Each writes one ``orm_effects`` row through SQLAlchemy (a sync ``Session``, an
``AsyncSession``) or Django's ORM (``ctx.atomic()``). ``block=True`` makes the
body, once its effect is written (flushed, not committed), record that it
started on a connection of its own (``orm_started``) and wait for a row in
``orm_gate``: a test kills the worker there, mid-body. ``fail_first`` raises
after the write on attempt 1.

The database is ``POSTBOX_DATABASE_URL`` unless a test calls :func:`use`.
Django is configured on first use when no settings module configured it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import psycopg
from sqlalchemy import BigInteger, Integer, Text, create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from postbox import task
from postbox.context import JobContext

QUEUE = "orm"

DDL = """
CREATE TABLE IF NOT EXISTS orm_effects (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id    bigint NOT NULL,
    label     text   NOT NULL,
    attempt   int    NOT NULL
);
CREATE TABLE IF NOT EXISTS orm_started (job_id bigint NOT NULL, attempt int NOT NULL, worker_id text NOT NULL);
CREATE TABLE IF NOT EXISTS orm_gate (label text PRIMARY KEY);
"""

GATE_WAIT = 60.0


class Base(DeclarativeBase):
    pass


class Effect(Base):
    __tablename__ = "orm_effects"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(BigInteger)
    label: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)


_url: str | None = None
_lock = threading.Lock()


_engines: dict[str, Engine] = {}
_async_engines: dict[str, AsyncEngine] = {}


def use(database_url: str) -> None:
    """Point the handlers at ``database_url`` (a psycopg URL); the engines made for another are disposed first."""
    global _url
    with _lock:
        if _async_engines:
            raise RuntimeError("await orm.dispose() before pointing the handlers at another database")
        _url = database_url
        for eng in _engines.values():
            eng.dispose()
        _engines.clear()


async def dispose() -> None:
    """Close the pooled connections of the engines the handlers made (on the loop that used them), and forget them."""
    with _lock:
        made, async_made = list(_engines.values()), list(_async_engines.values())
        _engines.clear()
        _async_engines.clear()
    for eng in made:
        eng.dispose()
    for aeng in async_made:
        await aeng.dispose()


def database_url() -> str:
    return _url or os.environ.get("POSTBOX_DATABASE_URL") or os.environ["DATABASE_URL"]


def sqlalchemy_url(driver: str) -> str:
    return f"postgresql+{driver}://" + database_url().split("://", 1)[1]


def engine(driver: str = "psycopg") -> Engine:
    """This process's engine for ``driver`` (made once, until :func:`use` or :func:`dispose`)."""
    with _lock:
        if driver not in _engines:
            _engines[driver] = create_engine(sqlalchemy_url(driver), pool_pre_ping=True)
        return _engines[driver]


def async_engine(driver: str = "psycopg") -> AsyncEngine:
    """This process's async engine for ``driver`` (made once, until :func:`dispose`)."""
    with _lock:
        if driver not in _async_engines:
            _async_engines[driver] = create_async_engine(sqlalchemy_url(driver))
        return _async_engines[driver]


def django_settings(url: str) -> dict[str, Any]:
    """Django's DATABASES["default"] for a psycopg URL."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


def django_ready() -> Any:
    """Django set up (configured here unless settings already were), and the effect model."""
    import django
    from django.conf import settings

    with _lock:
        if not settings.configured:
            settings.configure(DATABASES={"default": django_settings(database_url())}, USE_TZ=True, INSTALLED_APPS=[])
            django.setup()
        return _django_model()


@functools.cache
def _django_model() -> Any:
    from django.db import models

    class DjangoEffect(models.Model):
        job_id = models.BigIntegerField()
        label = models.TextField()
        attempt = models.IntegerField()

        class Meta:
            app_label = "postbox_orm_tests"
            db_table = "orm_effects"

    return DjangoEffect


def started_then_wait(ctx: JobContext, label: str) -> None:
    """Record that the body runs (own connection, committed), then wait for the test's gate."""
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO orm_started (job_id, attempt, worker_id) VALUES (%s, %s, %s)",
            (ctx.job_id, ctx.attempt, ctx.worker_id),
        )
        deadline = time.monotonic() + GATE_WAIT
        while conn.execute("SELECT 1 FROM orm_gate WHERE label = %s", (label,)).fetchone() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {label!r} never opened")
            time.sleep(0.05)


@task(queue=QUEUE, max_attempts=5)
def orm_sa_effect(ctx: JobContext, label: str, block: bool = False, fail_first: bool = False) -> None:
    with Session(engine()) as session, ctx.transaction(session):
        session.add(Effect(job_id=ctx.job_id, label=label, attempt=ctx.attempt))
        session.flush()
        if block:
            started_then_wait(ctx, label)
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails after its write")


@task(queue=QUEUE, max_attempts=5)
async def orm_sa_async_effect(ctx: JobContext, label: str, block: bool = False, fail_first: bool = False) -> None:
    async with AsyncSession(async_engine()) as session, ctx.transaction(session):
        session.add(Effect(job_id=ctx.job_id, label=label, attempt=ctx.attempt))
        await session.flush()
        if block:
            await asyncio.to_thread(started_then_wait, ctx, label)
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails after its write")


@task(queue=QUEUE, max_attempts=5)
def orm_django_effect(ctx: JobContext, label: str, block: bool = False, fail_first: bool = False) -> None:
    model = django_ready()
    with ctx.atomic():
        model.objects.create(job_id=ctx.job_id, label=label, attempt=ctx.attempt)
        if block:
            started_then_wait(ctx, label)
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails after its write")
