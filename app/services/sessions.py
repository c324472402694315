"""Dashboard sessions in PostgreSQL: made by a login, checked on each request, listed and revoked.

The browser holds a random token (``secrets.token_urlsafe``, 256 bits); the
``sessions`` table (migration ``0008_sessions``) holds its SHA-256 only. Each row
also holds an HMAC of that hash under the API key of the login: a session is
valid only while that HMAC, recomputed with the current ``POSTBOX_API_KEY``,
matches, so a new key ends every session without touching the table.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from postbox import sql

USER_AGENT_CHARS = 200


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def fingerprint(key: str, hashed: bytes) -> bytes:
    """The session's mark of the key it was made with (salted by the session: no shared value to look up)."""
    return hmac.new(key.encode("utf-8"), b"postbox-session-v1:" + hashed, hashlib.sha256).digest()


def made_with(key: str, hashed: bytes, stored: bytes) -> bool:
    return hmac.compare_digest(fingerprint(key, hashed), bytes(stored))


@dataclass(frozen=True)
class NewSession:
    id: int
    token: str
    expires_at: datetime


@dataclass(frozen=True)
class SessionInfo:
    id: int
    client: str | None
    user_agent: str | None
    created_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    valid: bool  # made with the current key


async def create(
    conn: AsyncConnection[Any], key: str, *, client: str | None, user_agent: str | None, ttl: float
) -> NewSession:
    """A new session for a login with ``key``; expired rows are deleted on the way."""
    token = new_token()
    hashed = token_hash(token)
    q = sql.active()
    await conn.execute(q.SESSION_PRUNE)
    cur = await conn.execute(
        q.SESSION_INSERT,
        {
            "token_hash": hashed,
            "key_fingerprint": fingerprint(key, hashed),
            "client": client,
            "user_agent": (user_agent or "")[:USER_AGENT_CHARS] or None,
            "ttl": ttl,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return NewSession(int(row[0]), token, row[1])


async def lookup(conn: AsyncConnection[Any], token: str, key: str) -> int | None:
    """The id of ``token``'s session when it exists, has not expired and was made with ``key``."""
    hashed = token_hash(token)
    cur = await conn.execute(sql.active().SESSION_TOUCH, {"token_hash": hashed})
    row = await cur.fetchone()
    if row is None or not made_with(key, hashed, row[1]):
        return None
    return int(row[0])


async def list_sessions(conn: AsyncConnection[Any], key: str | None, *, limit: int = 500) -> list[SessionInfo]:
    """Unexpired sessions, newest first; ``valid`` is false for those made with another key."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.active().SESSION_LIST, {"limit": limit})
        rows = await cur.fetchall()
    return [
        SessionInfo(
            id=int(r["id"]),
            client=r["client"],
            user_agent=r["user_agent"],
            created_at=r["created_at"],
            last_seen_at=r["last_seen_at"],
            expires_at=r["expires_at"],
            valid=key is not None and made_with(key, bytes(r["token_hash"]), r["key_fingerprint"]),
        )
        for r in rows
    ]


async def revoke(conn: AsyncConnection[Any], session_id: int) -> bool:
    cur = await conn.execute(sql.active().SESSION_DELETE, {"id": session_id})
    return await cur.fetchone() is not None


async def revoke_token(conn: AsyncConnection[Any], token: str) -> int | None:
    cur = await conn.execute(sql.active().SESSION_DELETE_TOKEN, {"token_hash": token_hash(token)})
    row = await cur.fetchone()
    return None if row is None else int(row[0])


async def revoke_all(conn: AsyncConnection[Any]) -> int:
    cur = await conn.execute(sql.active().SESSION_DELETE_ALL)
    return len(await cur.fetchall())
