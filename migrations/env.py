"""Alembic environment: plain SQL migrations run over psycopg 3."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from jobs.settings import libpq_url, load_settings

config = context.config


def _url() -> str:
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    if not url:
        url = load_settings().require_database_url()
    return "postgresql+psycopg://" + libpq_url(url).split("://", 1)[1]


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transactional_ddl=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
