"""postbox's schema in a Django database: brought to head after ``migrate``, emptied by ``flush``.

Both work on the database of a ``DATABASES`` alias. The upgrade runs postbox's
own alembic migrations (:func:`postbox.migrate.upgrade`) on that database's
URL, so a Django test database (``test_<NAME>``, which Django creates by running
``migrate``) gets postbox's schema, and ``--keepdb`` / ``--reuse-db`` finds it
there. It is skipped when the schema is already at head: a flush emits
``post_migrate`` too, after every ``TransactionTestCase``.
"""

from __future__ import annotations

import functools
from typing import Any, TextIO

from postbox import migrate as postbox_migrate
from postbox import sql
from postbox.django import conf


@functools.cache
def head() -> str:
    return postbox_migrate.head_revision()


def current_revision(using: str = "default") -> str | None:
    """The revision of postbox's schema in the alias's database (``None``: no schema)."""
    from django.db import connections

    statements = sql.statements(conf.schema_name())
    with connections[using].cursor() as cursor:
        cursor.execute(statements.MIGRATION_TABLE_EXISTS)
        row = cursor.fetchone()
        if not (row and row[0]):
            return None
        cursor.execute(statements.MIGRATION_VERSION)
        row = cursor.fetchone()
    return str(row[0]) if row else None


def migrate(using: str = "default", *, verbosity: int = 1, stdout: TextIO | Any = None) -> bool:
    """Upgrade postbox's schema in the alias's database to head; ``False`` when it was there already."""
    from django.db import connections

    if current_revision(using) == head():
        return False
    url = conf.database_url(connections[using].settings_dict)
    if url is None:
        raise RuntimeError(f"postbox needs PostgreSQL: DATABASES[{using!r}] is not a PostgreSQL database")
    if verbosity >= 1 and stdout is not None:
        stdout.write(f"  Applying postbox's schema ({conf.schema_name()}) to head {head()}\n")
    postbox_migrate.upgrade(url, schema_name=conf.schema_name())
    return True


def flush(using: str = "default") -> None:
    """Empty every postbox table in the alias's database (the migration version stays)."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute(sql.statements(conf.schema_name()).SCHEMA_TRUNCATE_ALL)
