"""Job control (issue 32): a running job's progress; debounced tasks.

``outbox.progress`` (jsonb, NULL until a handler reports): the last value a
run reported with ``ctx.progress(done, total, note)`` — ``{"done", "total",
"note", "attempt", "at"}`` — written by the worker at most once a second per
run and once more before the run's outcome (:mod:`postbox.progress`). Adding a
nullable column without a default rewrites nothing: it is instant on a large
outbox. Snooze needs no schema (its count is the history's ``snoozed`` rows).

Debounce (:func:`postbox.unique.debounce`): a uniqueness rule with
``"debounce": "last" | "merge"``. ``unique_claim()`` gives the job holding the
key, while it still waits (pending or queued), the new arguments — the newest,
or merged into its own — under the key's advisory lock, and returns it; when
that job was claimed meanwhile (its state moved on under the row lock) it
returns no holder, and a new job is inserted. ``enqueue()`` makes a debounced
task's new job due after the window (``period``) unless the call gives its own
time. Both functions are 0004's with those additions (derived from its text
below, so the two cannot drift); the downgrade puts 0004's back.

Revision ID: 0010_job_control
Revises: 0009_workflows
Create Date: 2026-12-02
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import context, op

from postbox.schema import render

revision = "0010_job_control"
down_revision = "0009_workflows"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE {schema}.outbox ADD COLUMN progress jsonb;
"""

DOWNGRADE = r"""
ALTER TABLE {schema}.outbox DROP COLUMN IF EXISTS progress;
"""

# What 0010 adds to 0004's unique_claim(), at its end.
_DEBOUNCE = r"""
    -- Debounce: the waiting holder takes these arguments. The UPDATE waits for a claim
    -- of the row in progress and rechecks its state: a job a worker took meanwhile is no
    -- holder any more (its run reads its arguments at the claim, so it has the last ones
    -- committed before it), and a new job is inserted.
    IF holder IS NOT NULL AND rule ? 'debounce' THEN
        UPDATE {schema}.outbox o
           SET args = CASE WHEN rule ->> 'debounce' = 'merge' THEN o.args || unique_claim.args
                           ELSE unique_claim.args END
         WHERE o.id = holder AND o.state IN ('pending', 'queued');
        IF NOT FOUND THEN
            holder := NULL;
        END IF;
    END IF;
END;
$$;
"""

_DUE = "coalesce(enqueue.run_at, now() + make_interval(secs => coalesce(enqueue.delay_seconds, 0)))"
_DUE_DEBOUNCED = (
    "coalesce(enqueue.run_at, now() + make_interval(secs => coalesce(enqueue.delay_seconds,"
    " CASE WHEN def.unique_rule ? 'debounce' THEN (def.unique_rule ->> 'period')::float8 END, 0)))"
)


def _v0004() -> ModuleType:
    """Migration 0004's module (its functions' text), loaded from this folder."""
    path = Path(__file__).with_name("0004_unique_jobs.py")
    spec = importlib.util.spec_from_file_location("postbox_migration_0004", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unique_claim_0004() -> str:
    """0004's ``CREATE FUNCTION unique_claim ... $$;``, as ``CREATE OR REPLACE``."""
    text: str = _v0004().UPGRADE
    start = text.index("CREATE FUNCTION {schema}.unique_claim")
    end = text.index("$$;", start) + len("$$;")
    return text[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1) + "\n"


def unique_claim_0010() -> str:
    body = _unique_claim_0004()
    tail = "END;\n$$;\n"
    assert body.endswith(tail)
    return body[: -len(tail)] + _DEBOUNCE.lstrip("\n")


def enqueue_0010() -> str:
    text: str = _v0004().ENQUEUE
    assert text.count(_DUE) == 1
    return text.replace(_DUE, _DUE_DEBOUNCED)


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.execute(render(UPGRADE, schema))
    op.execute(render(unique_claim_0010(), schema))
    op.execute(render(enqueue_0010(), schema))


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    op.execute(render(_v0004().ENQUEUE, schema))
    op.execute(render(_unique_claim_0004(), schema))
    op.execute(render(DOWNGRADE, schema))
