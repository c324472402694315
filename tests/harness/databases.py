"""A migrated template database per session; a fresh copy of it per test."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from jobs import migrate


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def admin_connect(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def create_template(admin_url: str) -> str:
    name = f"pbx_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with admin_connect(admin_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate.upgrade(with_database(admin_url, name))
    return name


def create_from_template(admin_url: str, template: str, prefix: str = "pbx_t") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin_connect(admin_url) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return name


def drop(admin_url: str, name: str) -> None:
    with admin_connect(admin_url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
