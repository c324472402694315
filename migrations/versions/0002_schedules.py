"""Periodic jobs: the schedules synchronised from code, and one row per enqueued occurrence.

``schedule_runs`` is keyed by (schedule, occurrence): whichever relay leads,
an occurrence can be enqueued once, and its job id is recorded beside it in
the same transaction (docs/periodic-jobs.md).

Revision ID: 0002_schedules
Revises: 0001_postbox
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0002_schedules"
down_revision = "0001_postbox"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE {schema}.schedules (
    name          text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    task          {schema}.task_name  NOT NULL,
    queue         {schema}.queue_name NOT NULL,
    priority      smallint    NOT NULL CHECK (priority BETWEEN 0 AND 9),
    max_attempts  integer     NOT NULL CHECK (max_attempts >= 1),
    args          {schema}.json_object NOT NULL DEFAULT '{{}}'::jsonb,
    cron          text,
    every_seconds double precision CHECK (every_seconds IS NULL OR every_seconds >= 1),
    tz            text        NOT NULL DEFAULT 'UTC',
    catch_up      text        NOT NULL DEFAULT 'latest' CHECK (catch_up IN ('latest', 'all', 'none')),
    max_catch_up  integer     NOT NULL DEFAULT 100 CHECK (max_catch_up >= 1),
    grace_seconds double precision NOT NULL DEFAULT 60 CHECK (grace_seconds >= 0),
    paused        boolean     NOT NULL DEFAULT false,
    removed_at    timestamptz,            -- no longer declared by the code that owns its task
    cursor_at     timestamptz NOT NULL,   -- latest occurrence considered (enqueued or skipped)
    next_run_at   timestamptz NOT NULL,   -- when the leader looks at it next
    last_run_at   timestamptz,            -- occurrence time of the latest enqueued occurrence
    last_job_id   bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
-- The leader's only question while idle: when is the next active schedule due?
CREATE INDEX schedules_due ON {schema}.schedules (next_run_at) WHERE NOT paused AND removed_at IS NULL;

CREATE TABLE {schema}.schedule_runs (
    schedule    text        NOT NULL,
    occurrence  timestamptz NOT NULL,
    job_id      bigint      NOT NULL,
    manual      boolean     NOT NULL DEFAULT false,   -- trigger-now by an operator
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, occurrence)
);
CREATE INDEX schedule_runs_enqueued ON {schema}.schedule_runs (enqueued_at);
"""

DOWNGRADE = r"""
DROP TABLE IF EXISTS {schema}.schedule_runs, {schema}.schedules;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
