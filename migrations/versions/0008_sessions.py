"""Dashboard sessions: server-side, revocable logins instead of the API key in a cookie.

One row per dashboard login (``postbox.app.services.sessions``). The cookie holds
a random token; the table holds only its SHA-256 (``token_hash``), so a copy of
the table logs no one in. ``key_fingerprint`` is an HMAC of the token's hash
under the API key the session was made with: when ``POSTBOX_API_KEY`` changes,
no session's fingerprint matches and every session ends. ``expires_at`` bounds
a session's life (``POSTBOX_API_SESSION_TTL``); ``last_seen_at`` is refreshed at
most once a minute. Logout and revocation delete the row. docs/dashboard.md.

Revision ID: 0008_sessions
Revises: 0007_commit_time
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import context, op

from postbox.schema import render

revision = "0008_sessions"
down_revision = "0007_commit_time"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE {schema}.sessions (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash      bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    key_fingerprint bytea NOT NULL,
    client          text,
    user_agent      text CHECK (length(user_agent) <= 200),
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);
CREATE INDEX sessions_expires_at ON {schema}.sessions (expires_at);
"""

DOWNGRADE = r"""
DROP TABLE {schema}.sessions;
"""


def upgrade() -> None:
    op.execute(render(UPGRADE, context.config.attributes["schema"]))


def downgrade() -> None:
    op.execute(render(DOWNGRADE, context.config.attributes["schema"]))
