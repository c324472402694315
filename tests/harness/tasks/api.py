"""Tasks the API and admin CLI tests enqueue (importable by worker subprocesses via POSTBOX_TASKS)."""

from __future__ import annotations

import os

from postbox import PermanentError, task


@task(queue="apiq")
async def api_echo(ctx, text: str = "hi") -> str:  # type: ignore[no-untyped-def]
    return text


@task(queue="apiq", max_attempts=2)
def api_needs_file(ctx, path: str) -> str:  # type: ignore[no-untyped-def]
    """Dead (permanent error) while ``path`` is missing; succeeds once it exists."""
    if not os.path.exists(path):
        raise PermanentError(f"{path} is missing")
    return "found"


@task(queue="apiq")
async def api_sum(ctx, a: int, b: int = 0) -> int:  # type: ignore[no-untyped-def]
    return a + b
