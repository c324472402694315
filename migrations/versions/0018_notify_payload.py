"""A one-job insert's notification carries the job, so that the relay can publish it without selecting it.

The outbox's statement trigger sent an empty ``postbox_outbox`` notification,
and the relay answered each with a select of the due, unpublished rows: at a
moderate rate, one job per wake-up, that select was a round trip on every
job's path from its commit to its handler (450 µs of the 2.6 ms at 200 jobs/s
on the 2-vCPU machine, docs/benchmarks.md, fifteenth round). Now, when a
statement inserted one row that the relay would select as it is (``pending``,
due, no fair queue's key), the notification's payload is that row as the
relay's select returns it, as a JSON array: the schema, id, queue, task,
arguments and headers as text, priority, attempts, the enqueue time in ms and
whether it expired. A statement of several rows (a bulk enqueue), a delayed or
waiting job, or a payload over 7,000 bytes (PostgreSQL takes 8,000) notifies
empty, as before. The relay still selects after every wake-up (relay/notifier.py):
the payload only lets the job go out first.

The trigger now needs the statement's rows (a transition table): one tuplestore
per insert statement.

Revision ID: 0018_notify_payload
Revises: 0017_key_lookups
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0018_notify_payload"
down_revision = "0017_key_lookups"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE OR REPLACE FUNCTION {schema}.notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    _payload text;
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM _inserted LIMIT 2) AS two) = 1 THEN
        SELECT json_build_array(TG_TABLE_SCHEMA, r.id, r.queue, r.task, r.args::text, r.headers::text, r.priority,
                                r.attempts, (extract(epoch FROM r.created_at) * 1000)::int8,
                                coalesce(r.expires_at < now(), false))::text
          INTO _payload
          FROM _inserted r
         WHERE r.state = 'pending' AND r.available_at <= now() AND r.fair_key IS NULL AND r.published_at IS NULL;
    END IF;
    IF _payload IS NULL OR octet_length(_payload) > 7000 THEN
        _payload := '';
    END IF;
    PERFORM pg_notify('postbox_outbox', _payload);
    RETURN NULL;
END;
$$;
DROP TRIGGER outbox_notify ON {schema}.outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox REFERENCING NEW TABLE AS _inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_outbox();
"""

DOWNGRADE = r"""
DROP TRIGGER outbox_notify ON {schema}.outbox;
CREATE OR REPLACE FUNCTION {schema}.notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('postbox_outbox', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_outbox();
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
