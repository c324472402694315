"""Run the alembic migrations programmatically (``postbox migrate``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(conn: object) -> str | None:
    """The revision a database is at, from an open psycopg connection."""
    cur = conn.execute(  # type: ignore[attr-defined]
        "SELECT version_num FROM alembic_version LIMIT 1" if _has_version_table(conn) else "SELECT NULL::text"
    )
    row = cur.fetchone()
    return row[0] if row else None


def _has_version_table(conn: object) -> bool:
    row = conn.execute("SELECT to_regclass('alembic_version') IS NOT NULL").fetchone()  # type: ignore[attr-defined]
    return bool(row and row[0])
