"""Connections: small helpers so every process opens PostgreSQL the same way."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, Connection


def connect(url: str, *, autocommit: bool = False, application_name: str = "postbox", **kwargs: Any) -> Connection[Any]:
    return Connection.connect(url, autocommit=autocommit, application_name=application_name, **kwargs)


async def connect_async(
    url: str, *, autocommit: bool = False, application_name: str = "postbox", **kwargs: Any
) -> AsyncConnection[Any]:
    return await AsyncConnection.connect(url, autocommit=autocommit, application_name=application_name, **kwargs)
