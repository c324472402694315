"""A migrated template database per session; a fresh copy of it per test.

Copying the template and dropping a used copy each wait for PostgreSQL to
write the files out (about 0.3-1 s a test, far more than most tests take):
:class:`Copies` does both on a thread of its own, a couple of copies ahead of
the tests and the drops behind them, so a test only waits when it outruns it.

Every database a test run creates is named ``pbx_<kind>_<host>_<pid>_<random>``
(host: a short hash of this machine's name). A run killed before its cleanup
leaves databases behind; the next run drops those whose process is gone on
this same host, and never touches another host's or a live run's databases.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import uuid
from collections import deque
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from postbox import migrate
from postbox_examples.stagedoor import schema as stagedoor_schema

HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def admin_connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def new_name(kind: str) -> str:
    return f"pbx_{kind}_{HOST}_{os.getpid()}_{uuid.uuid4().hex[:10]}"


def create(admin_url: str, kind: str, template: str | None = None) -> str:
    name = new_name(kind)
    with admin_connect(admin_url) as conn:
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    return name


def create_template(admin_url: str) -> str:
    name = create(admin_url, "tpl")
    url = with_database(admin_url, name)
    migrate.upgrade(url)
    stagedoor_schema.migrate(url)  # the example's own tables, as the demo creates them
    return name


def create_from_template(admin_url: str, template: str) -> str:
    return create(admin_url, "t", template)


class Copies:
    """Fresh copies of ``template`` made ahead, used copies dropped behind, on one thread.

    ``take()`` hands out a copy no one has used; ``give_back(name)`` queues it
    for dropping; the thread drops used copies whenever ``ahead`` copies are
    ready (a waiting test comes first); ``close()`` drops every copy left,
    ready or used. An error on the thread is raised by the next ``take()``.
    """

    def __init__(self, admin_url: str, template: str, ahead: int = 2) -> None:
        self.admin_url = admin_url
        self.template = template
        self.ahead = ahead
        self._ready: deque[str] = deque()
        self._used: deque[str] = deque()
        self._error: BaseException | None = None
        self._closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="test-database-copies", daemon=True)
        self._thread.start()

    def take(self, timeout: float = 300.0) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: self._ready or self._error is not None, timeout):
                raise TimeoutError(f"no copy of the template database within {timeout} s")
            if self._error is not None:
                raise RuntimeError("making copies of the template database failed") from self._error
            name = self._ready.popleft()
            self._changed.notify_all()
            return name

    def give_back(self, name: str) -> None:
        with self._changed:
            self._used.append(name)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()
        for name in [*self._ready, *self._used]:
            drop(self.admin_url, name)

    def _work(self) -> tuple[str, str] | None:
        with self._changed:
            self._changed.wait_for(
                lambda: self._closing or self._used or (len(self._ready) < self.ahead and self._error is None)
            )
            if self._closing:
                return None
            if len(self._ready) < self.ahead and self._error is None:
                return "create", ""
            return "drop", self._used.popleft()

    def _run(self) -> None:
        while (work := self._work()) is not None:
            action, name = work
            try:
                if action == "drop":
                    drop(self.admin_url, name)
                else:
                    made = create_from_template(self.admin_url, self.template)
                    with self._changed:
                        self._ready.append(made)
                        self._changed.notify_all()
            except BaseException as exc:  # handed to the next take(); the thread keeps dropping
                with self._changed:
                    self._error = exc
                    self._changed.notify_all()


def drop(admin_url: str, name: str) -> None:
    with admin_connect(admin_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def abandoned(names: list[str], host: str = HOST, alive: object = _alive) -> list[str]:
    """The names made on ``host`` by a process that no longer runs."""
    out = []
    for name in names:
        parts = name.split("_")
        if len(parts) == 5 and parts[0] == "pbx" and parts[2] == host and parts[3].isdigit():
            if not alive(int(parts[3])):  # type: ignore[operator]
                out.append(name)
    return out


def drop_abandoned(admin_url: str) -> list[str]:
    with admin_connect(admin_url) as conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pbx\\_%'")]
    gone = abandoned(names)
    for name in gone:
        drop(admin_url, name)
    return gone
