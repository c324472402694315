"""Query and path parameters shared by the routers (their validation is part of the OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from postbox.app.services.checks import MAX_BIGINT, MAX_PAGE
from postbox.states import ALL_STATES

JobId = Annotated[int, Path(ge=1, le=MAX_BIGINT, description="The job's outbox id.")]
QueueFilter = Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
TaskFilter = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
Cursor = Annotated[str | None, Query(max_length=64, description="next_cursor of the previous page.")]
StateFilter = Annotated[str | None, Query(pattern="^(" + "|".join(ALL_STATES) + ")$")]
