"""Seal stored arguments again under the current key (key rotation, :mod:`postbox.encryption`).

Every outbox row whose args (or kept result) are sealed under a key other than the keyring's
first is opened with the key it names and sealed under the first, by id from a
cursor, in small transactions; a row changed meanwhile (compare-and-set on the
args) is left for the next run. Rows of any state are resealed: a finished
job's args sit in the database and its backups as much as a waiting one's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, LiteralString

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
    statements = sql.active()
    # args are bound to their task, a kept result to its job (postbox.encryption.result_context)
    await _reseal_column(
        conn,
        keys,
        batch,
        done,
        statements.JOB_LIST_SEALED_WITH_OTHER_KEY,
        statements.JOB_SET_SEALED_ARGS,
        lambda row: (row[1], row[2]),
        "",
    )
    await _reseal_column(
        conn,
        keys,
        batch,
        done,
        statements.JOB_LIST_SEALED_RESULTS_WITH_OTHER_KEY,
        statements.JOB_SET_SEALED_RESULT,
        lambda row: (result_context(row[0]), row[1]),
        "result: ",
    )
    return done


async def _reseal_column(
    conn: AsyncConnection[Any],
    keys: Keyring,
    batch: int,
    done: Resealed,
    list_rows: LiteralString,
    set_row: LiteralString,
    opened_as: Callable[[tuple[Any, ...]], tuple[str, str]],
    label: str,
) -> None:
    """One sealed column, by id in transactions of ``batch`` rows: ``opened_as(row)`` -> (context, sealed text)."""
    after = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(list_rows, {"after": after, "kid": keys.current, "limit": batch})
            rows = await cur.fetchall()
            for row in rows:
                job_id = after = row[0]
                context, old = opened_as(row)
                try:
                    plaintext = keys.open(context, orjson.loads(old))
                except EncryptionError as exc:
                    done.failed.append((job_id, f"{label}{exc}"))
                    continue
                cur = await conn.execute(set_row, {"id": job_id, "old": old, "new": keys.seal(context, plaintext)})
                if cur.rowcount == 1:
                    done.resealed += 1
                else:
                    done.changed_meanwhile += 1
        if len(rows) < batch:
            return
