"""Task definitions known to the database.

Workers and the API publish the definitions of the tasks they loaded (queue,
priority, max attempts, timeout, result keeping, retry policy, uniqueness rule)
into ``postbox.tasks`` when they start. ``postbox.enqueue()`` applies them to a
job enqueued from SQL, a trigger or another language without its options, as
the Python ``enqueue()`` applies the ``@task`` defaults; explicit arguments win.
The uniqueness rule is always applied (docs/unique-jobs.md).
The upsert changes a row only when the definition changed, so many workers
starting at once write nothing new.
"""

from __future__ import annotations

from typing import Any

import orjson
from psycopg import AsyncConnection

from postbox import sql
from postbox.registry import Registry, TaskSpec


def _retry(spec: TaskSpec) -> str:
    policy = spec.retry
    fields = {"base_delay": policy.base_delay, "max_delay": policy.max_delay, "jitter": policy.jitter}
    return orjson.dumps({k: v for k, v in fields.items() if v is not None}, option=orjson.OPT_SORT_KEYS).decode()


def publish_params(registry: Registry, by: str) -> dict[str, Any]:
    """The upsert's parameters: one array per column, in name order."""
    specs = [registry.get(name) for name in registry.names()]
    return {
        "name": [spec.name for spec in specs],
        "queue": [spec.queue for spec in specs],
        "priority": [spec.priority for spec in specs],
        "max_attempts": [spec.max_attempts for spec in specs],
        "timeout": [None if spec.timeout is None else float(spec.timeout) for spec in specs],
        "keep_result": [spec.keep_result for spec in specs],
        "retry": [_retry(spec) for spec in specs],
        "unique_rule": [spec.unique_rule for spec in specs],
        "by": by,
    }


async def publish(conn: AsyncConnection[Any], registry: Registry, by: str) -> int:
    """Upsert every loaded task's definition; returns how many rows changed."""
    params = publish_params(registry, by)
    if not params["name"]:
        return 0
    cur = await conn.execute(sql.active().TASK_UPSERT_MANY, params)
    return cur.rowcount


async def known_queues(conn: AsyncConnection[Any], registry: Registry | None = None) -> list[str]:
    """The queues of every published task definition, and of ``registry``'s tasks: the queues that exist
    before their first job. ``postbox queues list``, ``GET /api/v1/queues`` and the dashboard list these
    (with the queues of the outbox's rows and of the queues table), so they agree."""
    cur = await conn.execute(sql.active().TASK_LIST_QUEUES)
    found = {str(row[0]) for row in await cur.fetchall()}
    return sorted(found | set(registry.queues() if registry is not None else ()))
