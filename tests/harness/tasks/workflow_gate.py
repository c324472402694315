"""The workflow test tasks plus a gate: ``--tasks tests.harness.tasks.workflow_gate`` loads both.

``wf_gate`` fails permanently (dead at once) until its label is in ``wf_gate``
(see ``GATE_DDL``); then it logs its run in ``wf_log`` as the other tasks do.
A test opens the gate and requeues the dead letter.
"""

from __future__ import annotations

from typing import Any

from postbox import PermanentError, task
from tests.harness.tasks import workflow
from tests.harness.tasks.workflow import FAST, QUEUE

__all__ = ["GATE_DDL", "wf_gate", "workflow"]

GATE_DDL = "CREATE TABLE IF NOT EXISTS wf_gate (label text PRIMARY KEY)"


@task(queue=QUEUE, retry=FAST, max_attempts=2)
async def wf_gate(ctx: Any, label: str) -> str:
    async with ctx.transaction() as conn:
        cur = await conn.execute("SELECT 1 FROM wf_gate WHERE label = %s", (label,))
        if await cur.fetchone() is None:
            raise PermanentError(f"gate {label} is closed")
        await conn.execute(
            "INSERT INTO wf_log (job_id, label, attempt) VALUES (%s, %s, %s)", (ctx.job_id, label, ctx.attempt)
        )
    return label
