"""The start of a long-running postbox process: valid settings, logging, an event loop.

Shared by ``relay run``, ``worker run`` and ``api run`` so each fails the same
way on bad settings (one line naming the setting, exit 2) and starts the same way.
A Redis Cluster node without ``POSTBOX_REDIS_CLUSTER`` is refused the same way
(a plain client would fail with MOVED, queue by queue, mid-run), and so are the
setting on a server that is not a cluster node.

Before any work, each process (and ``postbox migrate`` and the admin CLI) waits
for PostgreSQL and Redis to answer, for at most ``POSTBOX_START_TIMEOUT``
seconds (:func:`wait_for_postgres`, :func:`wait_for_redis`). A server that
answers with a refusal (a missing database, a wrong password) fails at once; one
that does not answer is retried until the bound. Either way the process prints
one line naming the URL (password hidden), what it tried and for how long, and
exits 2 — never a traceback. Once started, a process rides out outages.

A Django project's process (``DJANGO_SETTINGS_MODULE`` in the environment) is
set up first (``django.setup()``, :mod:`postbox.django.bootstrap`), so its
settings and task modules see a ready Django; Django is imported only then.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis

from postbox import logs
from postbox.errors import SettingsError
from postbox.redis_conn import cluster_mode, seed_urls
from postbox.settings import Settings, libpq_url, load_settings

T = TypeVar("T")
# What a PostgreSQL server says when it will soon accept connections: wait for it.
PG_TRANSIENT = ("the database system is starting up", "the database system is shutting down", "too many clients")
RETRY_PAUSE = 0.5


def process_settings(command: str, **overrides: Any) -> Settings | None:
    """Settings with both URLs required and both servers answering, logging set up; ``None`` after printing why not.

    Overrides that are ``None`` (a flag not given) leave the setting as configured.
    """
    problem = setup_frameworks()
    if problem is not None:
        print(f"postbox {command}: {problem}", file=sys.stderr)
        return None
    try:
        settings = load_settings(**{name: value for name, value in overrides.items() if value is not None})
        database_url = settings.require_database_url()
        redis_url = settings.require_redis_url()
    except SettingsError as exc:
        print(f"postbox {command}: {exc}", file=sys.stderr)
        return None
    failure = wait_for_postgres(database_url, settings.start_timeout) or wait_for_redis(
        redis_url, settings.start_timeout
    )
    if failure is not None:
        print(f"postbox {command}: {failure}", file=sys.stderr)
        return None
    try:
        refusal = cluster_refusal(redis_url, cluster=settings.redis_cluster)
    except SettingsError as exc:
        print(f"postbox {command}: {exc}", file=sys.stderr)
        return None
    if refusal is not None:
        print(f"postbox {command}: {refusal}", file=sys.stderr)
        return None
    logs.setup(json=settings.log_json, level=settings.log_level)
    return settings


def setup_frameworks() -> str | None:
    """Set up the web framework the process belongs to (Django, by ``DJANGO_SETTINGS_MODULE``); why not, or None."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    from postbox.django.bootstrap import setup

    return setup()


def cluster_refusal(redis_url: str, *, cluster: bool = False, timeout: float = 2.0) -> str | None:
    """Why ``redis_url`` cannot be used as configured; ``None`` when it can, or when it is down.

    ``cluster`` is ``POSTBOX_REDIS_CLUSTER``: it must match what the server is.
    An unreachable Redis is not refused: processes start and wait for it.
    """
    if not cluster and len(seed_urls(redis_url)) > 1:
        return "POSTBOX_REDIS_URL: several URLs need POSTBOX_REDIS_CLUSTER=true"
    found = cluster_mode(redis_url, timeout)
    if found is None or found == cluster:
        return None
    if found:
        return (
            "POSTBOX_REDIS_URL points at a Redis Cluster node: set POSTBOX_REDIS_CLUSTER=true "
            "to use the cluster (see docs/operations.md, Redis Cluster)"
        )
    return "POSTBOX_REDIS_CLUSTER is set but POSTBOX_REDIS_URL is not a Redis Cluster node (cluster_enabled:0)"


def hide_password(url: str) -> str:
    """``url`` with its password replaced by ``***`` (URLs and libpq ``password=`` strings)."""
    parts = urlsplit(url)
    if parts.password is not None and parts.hostname is not None:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    return re.sub(r"(password\s*=\s*)(\S+)", r"\1***", url)


def wait_for_postgres(url: str, timeout: float, *, clock: Callable[[], float] = time.monotonic) -> str | None:
    """``None`` once PostgreSQL at ``url`` accepts a connection; else, after ``timeout`` seconds, one line saying why.

    A refusal (no such database, no such role, a wrong password) ends the wait at once.
    """
    started = clock()
    attempts = 0
    while True:
        attempts += 1
        try:
            conn = psycopg.connect(
                libpq_url(url),
                autocommit=True,
                connect_timeout=max(2, min(10, int(timeout) + 1)),
                application_name="postbox-start",
            )
        except psycopg.OperationalError as exc:
            reason = _one_line(str(exc))
            if "FATAL:" in str(exc) and not any(text in str(exc) for text in PG_TRANSIENT):
                return f"PostgreSQL at {hide_password(url)} refused the connection: {reason}"
            elapsed = clock() - started
            if elapsed >= timeout:
                return _gave_up("PostgreSQL", url, reason, attempts, elapsed)
            time.sleep(max(0.0, min(RETRY_PAUSE, timeout - elapsed)))
            continue
        conn.close()
        return None


def wait_for_redis(url: str, timeout: float, *, clock: Callable[[], float] = time.monotonic) -> str | None:
    """``None`` once Redis at ``url`` (or one of its comma-separated nodes) answers PING; else one line saying why.

    A refusal (authentication, a database index the server does not have) ends the wait at once.
    """
    started = clock()
    attempts = 0
    while True:
        attempts += 1
        reason = ""
        for seed in seed_urls(url):
            client = redis.Redis.from_url(seed, socket_connect_timeout=2, socket_timeout=2)
            try:
                client.ping()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if isinstance(exc, redis.AuthenticationError):
                    return f"Redis at {hide_password(url)} refused the connection: {_one_line(str(exc))}"
                reason = _one_line(str(exc))
                continue
            except redis.RedisError as exc:
                return f"Redis at {hide_password(url)} refused the connection: {_one_line(str(exc))}"
            finally:
                client.close()
            return None
        elapsed = clock() - started
        if elapsed >= timeout:
            return _gave_up("Redis", url, reason, attempts, elapsed)
        time.sleep(max(0.0, min(RETRY_PAUSE, timeout - elapsed)))


def _gave_up(server: str, url: str, reason: str, attempts: int, elapsed: float) -> str:
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return (
        f"cannot reach {server} at {hide_password(url)}: {reason} "
        f"({tries} in {elapsed:.1f} s; POSTBOX_START_TIMEOUT bounds the wait)"
    )


def _one_line(text: str) -> str:
    """An error message on one line, without psycopg's ``connection failed:`` preamble."""
    text = next((line.strip() for line in text.splitlines() if line.strip()), "no answer")
    text = text.removeprefix("connection failed: ")
    return re.sub(r"^connection to server (at|on) .*? failed: (FATAL:\s+)?", "", text)


def settle_collector(threshold: int) -> None:
    """Make a started relay, worker or API process collect less often (``POSTBOX_GC_THRESHOLD``).

    Everything made so far (modules, task definitions, settings) is frozen out of the
    collector's passes, and its young generation is collected every ``threshold`` net
    allocations instead of CPython's 700. A job's Python allocates enough to start a young
    collection every few dozen jobs, each of which walked the jobs in flight and found
    next to nothing to free: about 6 % of a worker's CPU per no-op job
    (docs/benchmarks.md, twenty-first round). Cyclic garbage is still collected, later. 0
    leaves the collector as it is. Only the ``relay run``, ``worker run`` and ``api run``
    commands call this (``manage.py postbox worker run`` too); an application that runs a
    ``Worker`` or a ``Relay`` in a process of its own keeps its collector settings.
    """
    if threshold <= 0:
        return
    gc.collect()  # garbage made at start is freed first, not frozen with the rest
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop when installed (a dependency except on Windows), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
