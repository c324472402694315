"""Run postbox's alembic migrations programmatically (``postbox migrate``).

postbox's migrations touch only its own schema (:mod:`postbox.schema`) and keep
their version in ``<schema>.alembic_version``: an application that migrates its
own tables with alembic keeps its own history, untouched.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from postbox import schema, sql


def _migrations_dir() -> Path:
    # Installed: postbox/migrations. From a source checkout (editable install):
    # the repository's migrations/ folder, which is the package postbox.migrations.
    import postbox.migrations

    return Path(postbox.migrations.__file__).resolve().parent


def alembic_config(database_url: str, schema_name: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_migrations_dir()))
    config.attributes["database_url"] = database_url
    config.attributes["schema"] = schema.validate(schema_name or schema.active())
    return config


def upgrade(database_url: str, revision: str = "head", schema_name: str | None = None) -> None:
    command.upgrade(alembic_config(database_url, schema_name), revision)


def downgrade(database_url: str, revision: str = "base", schema_name: str | None = None) -> None:
    command.downgrade(alembic_config(database_url, schema_name), revision)


def upgrade_sql(database_url: str, revision: str = "head", schema_name: str | None = None) -> str:
    """The DDL an upgrade would run, as text (alembic's offline mode), for teams that apply it themselves."""
    out = io.StringIO()
    config = alembic_config(database_url, schema_name)
    config.output_buffer = out
    with redirect_stdout(out):
        command.upgrade(config, revision, sql=True)
    return out.getvalue()


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(conn: object) -> str | None:
    """The revision a database is at, from an open psycopg connection (None: never migrated)."""
    exists = conn.execute(sql.active().MIGRATION_TABLE_EXISTS).fetchone()  # type: ignore[attr-defined]
    if not (exists and exists[0]):
        return None
    row = conn.execute(sql.active().MIGRATION_VERSION).fetchone()  # type: ignore[attr-defined]
    return row[0] if row else None


# --- an application's own alembic project ---------------------------------------------


def include_name(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
    """``include_name`` for an application's alembic ``env.py``: skip postbox's schema.

    With ``include_schemas=True`` alembic's autogenerate (and ``alembic check``)
    reflects every schema, and would propose dropping postbox's tables, which
    the application's metadata does not declare. postbox migrates its schema
    itself (``postbox migrate``, :func:`upgrade`).
    """
    if type_ == "schema":
        return name != schema.active()
    return parent_names.get("schema_name") != schema.active()


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """``include_object`` for an application's alembic ``env.py``: skip every object in postbox's schema.

    For alembic versions or set-ups where :func:`include_name` is not enough
    (a table of postbox's schema named in the application's metadata).
    """
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return getattr(table, "schema", None) != schema.active()
