"""The bench's own database and Redis keys: created at start, removed at the end.

``postbox-bench`` never touches the application's data: it creates
``postbox_bench_<random>`` on the server named by the configured database URL
(migrated to head), uses a random Redis key prefix on the configured Redis, and
removes both when it ends, also after an error or Ctrl-C.  Peers get their own
database each and an empty Redis db number each.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis
from psycopg import sql

from postbox import migrate


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def create_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def delete_keys(redis_url: str, pattern: str) -> int:
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                removed: Any = client.delete(*batch)
                deleted += int(removed)
                batch = []
        if batch:
            rest: Any = client.delete(*batch)
            deleted += int(rest)
    finally:
        client.close()
    return deleted


def free_redis_dbs(redis_url: str, count: int, exclude: int) -> list[int]:
    """Up to ``count`` empty Redis db numbers, highest first (never ``exclude``)."""
    client = redis.Redis.from_url(redis_url)
    try:
        config: Any = client.config_get("databases")
        total = int(config.get("databases", 16))
        found = []
        for db in range(total - 1, -1, -1):
            if db == exclude:
                continue
            probe = redis.Redis.from_url(with_redis_db(redis_url, db))
            try:
                size: Any = probe.dbsize()
                if size == 0:
                    found.append(db)
            finally:
                probe.close()
            if len(found) == count:
                break
        return found
    finally:
        client.close()


def redis_db_of(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


@dataclass
class Sandbox:
    """Everything one bench run created, so it can all be removed."""

    server_url: str  # the configured database URL (its server may CREATE DATABASE)
    redis_url: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    databases: list[str] = field(default_factory=list)
    redis_dbs: list[int] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        return f"pbxbench-{self.token}"

    def database(self, label: str = "", *, migrated: bool = True) -> str:
        """A new database on the server (migrated to postbox's head unless told not to); returns its URL."""
        base = name = f"postbox_bench_{self.token}" + (f"_{label}" if label else "")
        n = 1
        while name in self.databases:  # two parts of one run may ask for the same label (a peer's, say)
            n += 1
            name = f"{base}_{n}"
        url = create_database(self.server_url, name)
        self.databases.append(name)
        if migrated:
            migrate.upgrade(url)
        return url

    def redis_db(self) -> str:
        """The URL of an empty Redis db number reserved for this run (a peer's)."""
        taken = set(self.redis_dbs) | {redis_db_of(self.redis_url)}
        candidates = [db for db in free_redis_dbs(self.redis_url, 16, redis_db_of(self.redis_url)) if db not in taken]
        if not candidates:
            raise RuntimeError("no empty Redis db number left for a peer")
        self.redis_dbs.append(candidates[0])
        return with_redis_db(self.redis_url, candidates[0])

    def clean_redis_prefix(self) -> None:
        delete_keys(self.redis_url, f"{self.prefix}*")

    def close(self) -> None:
        for name in reversed(self.databases):
            with contextlib.suppress(psycopg.Error):
                drop_database(self.server_url, name)
        self.databases.clear()
        with contextlib.suppress(redis.RedisError):
            self.clean_redis_prefix()
        for db in self.redis_dbs:
            with contextlib.suppress(redis.RedisError):
                delete_keys(with_redis_db(self.redis_url, db), "*")
        self.redis_dbs.clear()


@contextlib.contextmanager
def sandbox(server_url: str, redis_url: str) -> Iterator[Sandbox]:
    box = Sandbox(server_url, redis_url)
    try:
        yield box
    finally:
        box.close()
