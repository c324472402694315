"""The PostgreSQL schema postbox lives in, and SQL rendered for it.

Every table, function, domain and the migration version table of postbox are
in one schema, ``postbox`` unless ``POSTBOX_SCHEMA`` names another. Statements
are written as templates with ``{schema}`` where the name goes
(:mod:`postbox.sql`, the migrations); :func:`render` puts the name in through
``psycopg.sql.Identifier``, so it is always quoted as an identifier, never
pasted as text.

The schema is a property of the process: a producer's ``enqueue()`` on a
user's connection, the relay, the workers and the API all use
:func:`active`. It is read from ``POSTBOX_SCHEMA`` when first needed (nothing
happens at import). Loading the settings (``postbox.settings.load_settings``)
makes their schema the process's through :func:`follow_settings`; :func:`use`
chooses one explicitly, and that choice holds for the rest of the process
(a test run's schema of its own), whatever settings are loaded after it,
until :func:`reset`.
"""

from __future__ import annotations

import os
import re
from typing import LiteralString, cast

from psycopg import sql

from postbox.errors import SettingsError

DEFAULT_SCHEMA = "postbox"
# A plain lower-case identifier: no quoting surprises in psql, logs or docs.
SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

_active: str | None = None
_chosen = False  # use() was called: settings loaded later do not move the schema


def validate(name: str) -> str:
    """``name`` if it is a usable schema name; else :class:`SettingsError` naming the setting."""
    if not isinstance(name, str) or not SCHEMA_RE.match(name) or name.startswith("pg_"):
        raise SettingsError(
            f"POSTBOX_SCHEMA: invalid schema name {name!r}: must match {SCHEMA_RE.pattern} and not start with pg_"
        )
    return name


def active() -> str:
    """The schema of this process: set by :func:`use`, else ``POSTBOX_SCHEMA``, else ``postbox``."""
    global _active
    if _active is None:
        _active = validate(os.environ.get("POSTBOX_SCHEMA") or DEFAULT_SCHEMA)
    return _active


def use(name: str) -> None:
    """Make ``name`` this process's schema (validated), until :func:`reset`.

    Settings loaded afterwards (``enqueue()`` reads them) do not change it.
    """
    global _active, _chosen
    _active = validate(name)
    _chosen = True


def follow_settings(name: str) -> None:
    """The settings' schema becomes this process's, unless :func:`use` chose one."""
    global _active
    if not _chosen:
        _active = validate(name)


def reset() -> None:
    """Forget the explicit choice: the next :func:`active` reads the environment again (tests)."""
    global _active, _chosen
    _active = None
    _chosen = False


def render(template: LiteralString, schema_name: str) -> LiteralString:
    """``template`` with ``{schema}`` replaced by the quoted schema name.

    Other braces in a template must be doubled (``'{{}}'::jsonb``), as in
    ``str.format``; ``%(name)s`` parameters are left for the driver.
    """
    rendered = sql.SQL(template).format(schema=sql.Identifier(schema_name)).as_string(None)
    return cast(LiteralString, rendered)


class Templates:
    """A class of SQL templates (its upper-case attributes); an instance holds them rendered for one schema.

    ``postbox.sql.Statements`` is one; an edge module with SQL of its own (the
    dashboard's) subclasses it the same way.
    """

    def __init__(self, schema_name: str) -> None:
        self.schema = schema_name
        for cls in reversed(type(self).__mro__):
            for name, template in vars(cls).items():
                if name.isupper():
                    setattr(self, name, render(template, schema_name))
