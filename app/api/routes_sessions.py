"""``/api/v1/sessions``: the dashboard's login sessions, listed and revoked (with the key)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from psycopg import AsyncConnection
from pydantic import BaseModel, Field

from postbox.app.api.errors import ApiError, responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.state import SCOPE_SESSION, Destructive, api_state, db
from postbox.app.services import sessions
from postbox.app.services.audit import Actor, record_audit
from postbox.app.services.results import as_dict

router = APIRouter(prefix="/sessions", tags=["sessions"], route_class=StrictJsonRoute)
SessionId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The session's id (GET /api/v1/sessions).")]
Conn = Annotated[AsyncConnection[Any], Depends(db)]


class Session(BaseModel):
    id: int
    client: str | None = Field(description="The address the login came from.")
    user_agent: str | None = Field(description="The browser's User-Agent at login (200 characters at most).")
    created_at: datetime
    last_seen_at: datetime = Field(description="The last request with it (refreshed at most once a minute).")
    expires_at: datetime
    valid: bool = Field(description="False: made with an earlier POSTBOX_API_KEY, so it no longer logs in.")
    current: bool = Field(description="True: the session this request was made with.")


class Revoked(BaseModel):
    revoked: int = Field(description="How many sessions were ended.")


@router.get("", response_model=list[Session], summary="Live dashboard sessions", responses=responses(401, 403))
async def list_sessions(request: Request, conn: Conn, actor: Actor = Destructive) -> list[dict[str, Any]]:
    mine = request.scope.get(SCOPE_SESSION)
    found = await sessions.list_sessions(conn, api_state(request).settings.api_key)
    return [{**as_dict(item), "current": item.id == mine} for item in found]


@router.delete(
    "/{session_id}", response_model=Revoked, summary="End one session", responses=responses(401, 403, 404, 422)
)
async def revoke(session_id: SessionId, conn: Conn, actor: Actor = Destructive) -> dict[str, int]:
    if not await sessions.revoke(conn, session_id):
        raise ApiError(404, "NOT_FOUND", f"no session {session_id}")
    await record_audit(conn, actor, "session.revoke", f"session:{session_id}")
    return {"revoked": 1}


@router.delete("", response_model=Revoked, summary="End every session", responses=responses(401, 403))
async def revoke_all(conn: Conn, actor: Actor = Destructive) -> dict[str, int]:
    count = await sessions.revoke_all(conn)
    await record_audit(conn, actor, "session.revoke_all", "sessions", {"revoked": count})
    return {"revoked": count}
