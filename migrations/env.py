"""Alembic environment of postbox's own schema: plain SQL migrations over psycopg 3.

Everything, the version table included, lives in the schema named by
``config.attributes["schema"]`` (``postbox.migrate`` sets it from
``POSTBOX_SCHEMA``), so a database the application migrates with its own
alembic history keeps its ``public.alembic_version`` untouched.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from postbox import schema
from postbox.settings import libpq_url, load_settings

config = context.config
SCHEMA = schema.validate(config.attributes.get("schema") or schema.active())
config.attributes["schema"] = SCHEMA
VERSION_TABLE = "alembic_version"


def _url() -> str:
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    if not url:
        url = load_settings().require_database_url()
    return "postgresql+psycopg://" + libpq_url(url).split("://", 1)[1]


def _create_schema() -> None:
    # alembic creates its version table before the first revision runs.
    context.execute(schema.render("CREATE SCHEMA IF NOT EXISTS {schema}", SCHEMA))


def run_migrations_offline() -> None:
    """``postbox migrate --sql``: print the DDL instead of running it."""
    context.configure(
        url=_url(),
        literal_binds=True,
        # Named parameters: SQLAlchemy then leaves a literal % alone. The psycopg
        # dialect's pyformat would print PL/pgSQL's %ROWTYPE and RAISE's % as %%,
        # which psql refuses.
        dialect_opts={"paramstyle": "named"},
        transactional_ddl=True,
        version_table=VERSION_TABLE,
        version_table_schema=SCHEMA,
    )
    with context.begin_transaction():
        _create_schema()
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        # The version table is created before the first revision runs: its schema first.
        connection.execute(text(schema.render("CREATE SCHEMA IF NOT EXISTS {schema}", SCHEMA)))
        connection.commit()
        context.configure(
            connection=connection,
            transactional_ddl=True,
            version_table=VERSION_TABLE,
            version_table_schema=SCHEMA,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
