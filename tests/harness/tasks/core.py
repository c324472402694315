"""Tasks the foundation tests enqueue (importable by worker subprocesses too)."""

from __future__ import annotations

from postbox import task


@task
async def noop(ctx) -> None:  # type: ignore[no-untyped-def]
    return None


@task(queue="mail", priority=7, max_attempts=3)
async def send_welcome(ctx, user_id: int, lang: str = "en") -> None:  # type: ignore[no-untyped-def]
    return None


@task(name="core.sync_add")
def sync_add(ctx, a: int, b: int) -> int:  # type: ignore[no-untyped-def]
    return a + b
