"""Workflow lifecycle events (issue 31): releases and cascade cancels announced at commit.

The release of a workflow's job (``waiting`` to ``pending``) and its cancellation
by an upstream failure (``waiting`` to ``cancelled``, ``UpstreamFailed``) happen
inside 0009's triggers, in whichever statement ended the upstream job. The row
trigger ``outbox_workflow_left_waiting`` (AFTER UPDATE OF state, only for a row
leaving ``waiting`` that way) sends a NOTIFY on ``postbox_workflow`` naming the
job, its workflow, queue, task and the schema. A NOTIFY is delivered at commit
and never for a transaction that rolled back, so the events say only what
committed; the leading relay forwards them to the events channel
(``postbox.relay.workflow_events``). A row trigger with a ``WHEN`` clause costs
an UPDATE that does not match it nothing but that test: the outcomes of jobs
that release nothing pay nothing more.

``workflows.ended_at`` is when the relay saw the workflow's last job end and
announced ``workflow_finished``: it announces each end once (a conditional
UPDATE decides), and a retry or a dead letter's requeue sets it back to NULL.
Workflows that had ended before this revision are marked ended now, so the
first relay does not announce the whole history.

docs/workflows.md.

Revision ID: 0012_workflow_events
Revises: 0011_fair_queues
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0012_workflow_events"
down_revision = "0011_fair_queues"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE {schema}.workflows ADD COLUMN ended_at timestamptz;
UPDATE {schema}.workflows w SET ended_at = now()
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox o WHERE o.workflow_id = w.id
                      AND o.state IN ('waiting', 'pending', 'queued', 'running', 'retrying'));

CREATE FUNCTION {schema}.workflow_job_left_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postbox_workflow', json_build_object(
        'schema', TG_TABLE_SCHEMA,
        'type', CASE WHEN NEW.state = 'pending' THEN 'released' ELSE 'cancelled' END,
        'job_id', NEW.id, 'workflow_id', NEW.workflow_id, 'queue', NEW.queue, 'task', NEW.task)::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_workflow_left_waiting AFTER UPDATE OF state ON {schema}.outbox FOR EACH ROW
    WHEN (OLD.state = 'waiting' AND (NEW.state = 'pending'
          OR (NEW.state = 'cancelled' AND NEW.last_error_class = 'UpstreamFailed')))
    EXECUTE FUNCTION {schema}.workflow_job_left_waiting();
"""

DOWNGRADE = r"""
DROP TRIGGER outbox_workflow_left_waiting ON {schema}.outbox;
DROP FUNCTION {schema}.workflow_job_left_waiting();
ALTER TABLE {schema}.workflows DROP COLUMN ended_at;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
