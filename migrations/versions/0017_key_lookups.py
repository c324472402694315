"""The claim, the outcome and the relay's mark look their rows up by primary key on any outbox.

These functions keep one generic plan per connection (migration 0013), made at
their first call. On an outbox that was small or never analyzed then (a new
installation, a quiet shop, a benchmark that starts from an empty table) the
planner took a sequential scan as cheapest for "the rows whose id is in this
array", and the connection kept that plan while the table grew, until an
ANALYZE replaced it: every call then read the whole outbox. On 1,500 rows a
one-job claim cost its backend 380 µs of CPU instead of 200
(docs/benchmarks.md, "Key lookups"). The rows are always named by id, a few per
call. The functions now plan with ``random_page_cost`` at 1.1 (an index page
read from memory costs about what a sequential one does, as it does for these
hot rows): the primary key then wins on any table, a three-row one included.
The setting holds inside the functions only.

``enable_seqscan = off`` does the same for the claim, and was tried first: it
made the relay's mark take 165 ms a call (every plan that keeps a sequential
scan, of the small ``relays`` table here, costs the same huge penalty, and the
planner's comparisons of the rest lose their meaning).

Revision ID: 0017_key_lookups
Revises: 0016_success_notice
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0017_key_lookups"
down_revision = "0016_success_notice"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER FUNCTION {schema}.claim_attempts(bigint[], text[], text, double precision) SET random_page_cost = 1.1;
ALTER FUNCTION {schema}.mark_published(bigint[], text[], bigint, integer[]) SET random_page_cost = 1.1;
ALTER FUNCTION {schema}.record_outcomes(text, bigint[], integer[], text[], text[], double precision[], text[],
                                        double precision[], text[], text[], text[], boolean, text)
    SET random_page_cost = 1.1;
ALTER FUNCTION {schema}.notify_results(bigint[]) SET random_page_cost = 1.1;
"""

DOWNGRADE = r"""
ALTER FUNCTION {schema}.claim_attempts(bigint[], text[], text, double precision) RESET random_page_cost;
ALTER FUNCTION {schema}.mark_published(bigint[], text[], bigint, integer[]) RESET random_page_cost;
ALTER FUNCTION {schema}.record_outcomes(text, bigint[], integer[], text[], text[], double precision[], text[],
                                        double precision[], text[], text[], text[], boolean, text)
    RESET random_page_cost;
ALTER FUNCTION {schema}.notify_results(bigint[]) RESET random_page_cost;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
