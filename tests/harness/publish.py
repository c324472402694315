"""A tiny stand-in publisher for worker tests: the relay's contract, step by step.

``publish_due`` does what the relay does (select due unpublished rows, XADD
them and the wake-up entry naming their streams, mark them per the contract);
``xadd_again`` XADDs a row once more without marking anything, as a relay crash
between XADD and mark would. Tests that need the real relay process use
``relay/``.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis
from psycopg import AsyncConnection

from postbox.streams import WAKE_MAXLEN, encode_entry, stream_key, wake_entry, wake_key

SELECT_DUE = """
SELECT id, queue, task, args::text, headers::text, priority, attempts,
       (extract(epoch FROM created_at) * 1000)::int8
  FROM postbox.outbox
 WHERE published_at IS NULL AND state IN ('pending', 'retrying') AND available_at <= now()
 ORDER BY id
"""

SELECT_ROWS = """
SELECT id, queue, task, args::text, headers::text, priority, attempts,
       (extract(epoch FROM created_at) * 1000)::int8
  FROM postbox.outbox WHERE id = ANY(%(ids)s) ORDER BY id
"""

MARK = """
UPDATE postbox.outbox SET state = 'queued', published_at = now(), publish_count = publish_count + 1, stream_id = u.sid
  FROM unnest(%(ids)s::int8[], %(sids)s::text[]) AS u(id, sid)
 WHERE outbox.id = u.id AND outbox.published_at IS NULL AND outbox.state IN ('pending', 'retrying')
"""


async def _xadd(redis: aioredis.Redis, prefix: str, rows: list[tuple[Any, ...]]) -> list[str]:
    now_ms = int(time.time() * 1000)
    async with redis.pipeline(transaction=False) as pipe:
        for job_id, queue, task, args, headers, priority, attempts, enq_ms in rows:
            fields = encode_entry(
                job_id=job_id,
                task=task,
                args=args,
                headers=headers,
                attempt=attempts,
                queue=queue,
                priority=priority,
                enqueued_ms=enq_ms,
                published_ms=now_ms,
            )
            pipe.xadd(stream_key(prefix, queue, priority), fields)  # type: ignore[arg-type]
        # the wake-up entry after the XADDs, as the relay writes it (postbox.streams.wake_key)
        wake = wake_entry((row[1], row[5]) for row in rows)
        pipe.xadd(wake_key(prefix), dict(zip(wake[::2], wake[1::2], strict=True)), maxlen=WAKE_MAXLEN, approximate=True)
        replies = await pipe.execute()
    return [r.decode() if isinstance(r, bytes) else str(r) for r in replies[:-1]]


async def publish_due(aconn: AsyncConnection[Any], redis: aioredis.Redis, prefix: str) -> list[int]:
    """Publish every due, unpublished row once, like the relay; returns the ids."""
    cur = await aconn.execute(SELECT_DUE)
    rows = await cur.fetchall()
    await aconn.commit()
    if not rows:
        return []
    sids = await _xadd(redis, prefix, rows)
    await aconn.execute(MARK, {"ids": [r[0] for r in rows], "sids": sids})
    await aconn.commit()
    return [r[0] for r in rows]


async def xadd_again(aconn: AsyncConnection[Any], redis: aioredis.Redis, prefix: str, ids: list[int]) -> list[str]:
    """XADD these rows again (a duplicate publish); marks nothing. Returns the new entry ids."""
    cur = await aconn.execute(SELECT_ROWS, {"ids": ids})
    rows = await cur.fetchall()
    await aconn.commit()
    return await _xadd(redis, prefix, rows)
