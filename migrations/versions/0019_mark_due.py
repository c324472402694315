"""The relay's mark leaves a row whose due time moved into the future since it was sent.

``mark_published()`` (migration 0015) marks the rows of a batch the relay sent
that are still unpublished and at the attempt it sent. Between the send and the
mark (one round trip, or the hold of ``POSTBOX_RELAY_MARK_DELAY``; for a job
sent from its notification, also the time the notification waited for the
relay's turn) an operator can move the job to a later time (``POST
/api/v1/jobs/{id}/move``, ``postbox jobs move``): the row is then unpublished with a future ``available_at``, and
the mark took it for sent. It became ``queued`` behind an entry the claim skips
(not due), so the reconciler's sweep found its entry gone and published it again
every few seconds, warning each time, until the new time came. The mark now also
requires the row to be due: a moved row stays unpublished, and the relay sends
it once, when it is due; the entry sent before the move is skipped by the claim
and acknowledged.

Revision ID: 0019_mark_due
Revises: 0018_notify_payload
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0019_mark_due"
down_revision = "0018_notify_payload"
branch_labels = None
depends_on = None

# 0015's function with 0017's setting (CREATE OR REPLACE keeps only the SET clauses it names).
FUNCTION = r"""
CREATE OR REPLACE FUNCTION {schema}.mark_published(_ids bigint[], _sids text[], _term bigint, _attempts integer[])
RETURNS TABLE (leads boolean, marked bigint, next_due double precision)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET random_page_cost = 1.1 AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lead AS (
        SELECT _term IS NULL OR coalesce(max(r.term), 0) <= _term AS leads FROM {schema}.relays r
    ), locked AS MATERIALIZED (
        SELECT j.ctid FROM {schema}.outbox j
          JOIN unnest(_ids, _attempts) AS s(id, attempts) ON j.id = s.id
         WHERE (SELECT l.leads FROM lead l)
           AND (j.published_at IS NULL AND j.state IN ('pending', 'retrying') AND j.attempts = s.attempts
                {due}) IS TRUE
         ORDER BY j.id
           FOR UPDATE OF j
    ), marked AS (
        UPDATE {schema}.outbox AS o
           SET state = 'queued', published_at = now(), publish_count = o.publish_count + 1, stream_id = u.sid
          FROM unnest(_ids, _sids) AS u(id, sid)
         WHERE o.ctid = ANY(ARRAY(SELECT k.ctid FROM locked k)) AND o.id = u.id
        RETURNING 1
    )
    SELECT (SELECT l.leads FROM lead l), (SELECT count(*) FROM marked),
           (SELECT extract(epoch FROM min(d.available_at) - now())::float8
              FROM {schema}.outbox d
             WHERE d.published_at IS NULL AND d.state IN ('pending', 'retrying') AND d.available_at > now());
END;
$$;
"""

UPGRADE = FUNCTION.replace("{due}", "AND j.available_at <= now()")
DOWNGRADE = FUNCTION.replace("{due}", "")


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
