"""The relay's mark names the attempt it sent: a row claimed and ended meanwhile is left alone.

``mark_published()`` (migration 0013) marks the rows of a batch the relay sent
that are still unpublished (``published_at IS NULL``, pending or retrying). A
worker can take the entry, claim the job, run it and record a retry before the
mark arrives: the row is then unpublished again, for its next attempt, and the
mark took it for sent. It became ``queued`` with no entry behind it until the
reconciler's sweep noticed, seconds later. The window was one round trip; with the
relay holding a part batch's mark back (``POSTBOX_RELAY_MARK_DELAY``, docs/relay.md)
it is the hold, and a job that fails at once falls into it. The mark now takes the
``attempts`` each row had when it was selected, and leaves a row whose count moved
(every claim that runs a job adds one).

Revision ID: 0015_mark_attempts
Revises: 0014_result_waiters
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0015_mark_attempts"
down_revision = "0014_result_waiters"
branch_labels = None
depends_on = None

UPGRADE = r"""
DROP FUNCTION {schema}.mark_published(bigint[], text[], bigint);

CREATE FUNCTION {schema}.mark_published(_ids bigint[], _sids text[], _term bigint, _attempts integer[])
RETURNS TABLE (leads boolean, marked bigint, next_due double precision)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lead AS (
        SELECT _term IS NULL OR coalesce(max(r.term), 0) <= _term AS leads FROM {schema}.relays r
    ), locked AS MATERIALIZED (
        SELECT j.ctid FROM {schema}.outbox j
          JOIN unnest(_ids, _attempts) AS s(id, attempts) ON j.id = s.id
         WHERE (SELECT l.leads FROM lead l)
           AND (j.published_at IS NULL AND j.state IN ('pending', 'retrying') AND j.attempts = s.attempts) IS TRUE
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

# 0013's function, as it was.
DOWNGRADE = r"""
DROP FUNCTION {schema}.mark_published(bigint[], text[], bigint, integer[]);

CREATE FUNCTION {schema}.mark_published(_ids bigint[], _sids text[], _term bigint)
RETURNS TABLE (leads boolean, marked bigint, next_due double precision)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH lead AS (
        SELECT _term IS NULL OR coalesce(max(r.term), 0) <= _term AS leads FROM {schema}.relays r
    ), locked AS MATERIALIZED (
        SELECT j.ctid FROM {schema}.outbox j
         WHERE (SELECT l.leads FROM lead l)
           AND j.id = ANY(_ids) AND (j.published_at IS NULL AND j.state IN ('pending', 'retrying')) IS TRUE
         ORDER BY j.id
           FOR UPDATE
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


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
