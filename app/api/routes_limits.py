"""``/api/v1/limits``: flow-control limits (declared, overridden, in force, slots in use) and their overrides."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from psycopg import AsyncConnection
from starlette.convertors import Convertor, register_url_convertor

from postbox.app.api.errors import responses
from postbox.app.api.json_body import StrictJsonRoute
from postbox.app.api.schemas import Limit, LimitOverride
from postbox.app.api.state import Destructive, db, read_access
from postbox.app.services import limits as limit_service
from postbox.app.services.audit import Actor
from postbox.app.services.results import as_dict

router = APIRouter(prefix="/limits", tags=["limits"], dependencies=[Depends(read_access)], route_class=StrictJsonRoute)

Scope = Annotated[str, Path(description="queue or task.", examples=["queue"])]
# A task name may hold any character but NUL (slashes too: the rest of the path).
Name = Annotated[str, Path(description="The queue's or the task's name.", examples=["default"])]


class LimitNameConvertor(Convertor[str]):
    """The rest of the path, line breaks included (Starlette's ``path`` stops at one: a task
    named with a newline was a 404 "no route" instead of its limits)."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("limit_name", LimitNameConvertor())


@router.get("", response_model=list[Limit], summary="Every flow-control limit", responses=responses(401))
async def list_limits(conn: Annotated[AsyncConnection[Any], Depends(db)]) -> list[dict[str, Any]]:
    return [as_dict(item) for item in await limit_service.list_limits(conn)]


@router.get(
    "/{scope}/{name:limit_name}",
    response_model=Limit,
    summary="One queue's or task's limits",
    responses=responses(401, 404, 422),
)
async def get_limit(scope: Scope, name: Name, conn: Annotated[AsyncConnection[Any], Depends(db)]) -> dict[str, Any]:
    return as_dict(await limit_service.get_limit(conn, scope, name))


@router.put(
    "/{scope}/{name:limit_name}",
    response_model=Limit,
    summary="Override a queue's or task's limits (merged into the current override; no restart)",
    responses=responses(401, 403, 422),
)
async def set_override(
    scope: Scope,
    name: Name,
    body: LimitOverride,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    actor: Actor = Destructive,
) -> dict[str, Any]:
    values = body.model_dump(exclude_unset=True)
    return as_dict(await limit_service.set_override(conn, scope, name, values, actor))


@router.delete(
    "/{scope}/{name:limit_name}",
    response_model=Limit,
    summary="Lift an override (or one of its fields): the declared limits are in force again",
    responses=responses(401, 403, 404, 422),
)
async def clear_override(
    scope: Scope,
    name: Name,
    conn: Annotated[AsyncConnection[Any], Depends(db)],
    field: Annotated[str | None, Query(description="concurrency or rate: lift only that field.")] = None,
    actor: Actor = Destructive,
) -> dict[str, Any]:
    return as_dict(await limit_service.clear_override(conn, scope, name, actor, field=field))
