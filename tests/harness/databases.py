"""A migrated template database per session; a fresh copy of it per test.

Every database a test run creates is named ``pbx_<kind>_<host>_<pid>_<random>``
(host: a short hash of this machine's name). A run killed before its cleanup
leaves databases behind; the next run drops those whose process is gone on
this same host, and never touches another host's or a live run's databases.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from postbox import migrate
from postbox.app.stagedoor import schema as stagedoor_schema

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
