"""Seal stored arguments again under the current key (key rotation, :mod:`postbox.encryption`).

Every outbox row whose args (or kept result) are sealed under a key other than the keyring's
first is opened with the key it names and sealed under the first, by id from a
cursor, in small transactions; a row changed meanwhile (compare-and-set on the
args) is left for the next run. Rows of any state are resealed: a finished
job's args sit in the database and its backups as much as a waiting one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from psycopg import AsyncConnection

from postbox import sql
from postbox.encryption import EncryptionError, Keyring, result_context


@dataclass
class Resealed:
    resealed: int = 0
    changed_meanwhile: int = 0  # left for the next run
    failed: list[tuple[int, str]] = field(default_factory=list)  # (job id, why): a key this process lacks


async def reseal(conn: AsyncConnection[Any], keys: Keyring, *, batch: int = 500) -> Resealed:
    """Seal every row sealed under another key under ``keys.current``; returns the counts."""
    done = Resealed()
    after = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                sql.active().JOB_LIST_SEALED_WITH_OTHER_KEY, {"after": after, "kid": keys.current, "limit": batch}
            )
            rows = await cur.fetchall()
            for job_id, task, old in rows:
                after = job_id
                try:
                    plaintext = keys.open(task, orjson.loads(old))
                except EncryptionError as exc:
                    done.failed.append((job_id, str(exc)))
                    continue
                cur = await conn.execute(
                    sql.active().JOB_SET_SEALED_ARGS, {"id": job_id, "old": old, "new": keys.seal(task, plaintext)}
                )
                if cur.rowcount == 1:
                    done.resealed += 1
                else:
                    done.changed_meanwhile += 1
        if len(rows) < batch:
            break
    await _reseal_results(conn, keys, batch, done)
    return done


async def _reseal_results(conn: AsyncConnection[Any], keys: Keyring, batch: int, done: Resealed) -> None:
    """The kept results of encrypted tasks, as :func:`reseal` does the args (bound to their job, not task)."""
    after = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                sql.active().JOB_LIST_SEALED_RESULTS_WITH_OTHER_KEY,
                {"after": after, "kid": keys.current, "limit": batch},
            )
            rows = await cur.fetchall()
            for job_id, old in rows:
                after = job_id
                context = result_context(job_id)
                try:
                    plaintext = keys.open(context, orjson.loads(old))
                except EncryptionError as exc:
                    done.failed.append((job_id, f"result: {exc}"))
                    continue
                cur = await conn.execute(
                    sql.active().JOB_SET_SEALED_RESULT, {"id": job_id, "old": old, "new": keys.seal(context, plaintext)}
                )
                if cur.rowcount == 1:
                    done.resealed += 1
                else:
                    done.changed_meanwhile += 1
        if len(rows) < batch:
            return
