"""postbox's settings from a Django project's settings, below the environment.

In ``settings.py``::

    POSTBOX = {
        "REDIS_URL": "redis://localhost:6379/0",
        "CONCURRENCY": 20,
        "TASKS": ["orders.tasks"],
    }

Keys are the settings of docs/configuration.md without their ``POSTBOX_`` prefix
(``SCHEMA`` for ``POSTBOX_SCHEMA``), in any case; an unknown key is refused.
Three more keys belong to Django only: ``DATABASE_ALIAS`` (the ``DATABASES``
entry postbox uses, default ``"default"``), ``MIGRATE`` (``manage.py migrate``
brings postbox's schema to head too; default true) and nothing else.

Precedence, highest first: arguments and flags, the environment
(``POSTBOX_*``, ``DATABASE_URL``, ``REDIS_URL``), ``settings.POSTBOX``, then
what is derived from Django: the database URL from ``DATABASES[alias]`` (a
PostgreSQL engine; ``application_name`` is left to postbox), and the task
modules: every installed app's ``tasks`` module when ``TASKS`` is not given.
All of it only with ``"postbox.django"`` in ``INSTALLED_APPS``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from postbox import schema
from postbox.errors import SettingsError

APP = "postbox.django"
DJANGO_ONLY = frozenset({"DATABASE_ALIAS", "MIGRATE"})
RENAMED = {"SCHEMA": "schema_name"}
# Connection parameters of DATABASES[...]["OPTIONS"] that libpq takes in a URL.
LIBPQ_OPTIONS = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "channel_binding",
        "gssencmode",
        "connect_timeout",
        "options",
        "target_session_attrs",
        "service",
        "passfile",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
    }
)


class DjangoSettingsSource(PydanticBaseSettingsSource):
    """A pydantic-settings source: ``settings.POSTBOX`` and what is derived from Django."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ gives the whole dict

    def __call__(self) -> dict[str, Any]:
        return values(set(self.settings_cls.model_fields))


def settings_source(settings_cls: type[BaseSettings]) -> DjangoSettingsSource | None:
    """The source when this is a Django process with ``postbox.django`` installed, else ``None``."""
    if not installed():
        return None
    return DjangoSettingsSource(settings_cls)


def _django_settings() -> Any | None:
    """``django.conf.settings`` when Django is installed and configured (or configurable), else ``None``."""
    try:
        from django.conf import settings
    except ImportError:
        return None
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    return settings


def installed() -> bool:
    """``postbox.django`` is in ``INSTALLED_APPS`` (reading the settings module, not setting Django up)."""
    settings = _django_settings()
    if settings is None:
        return False
    try:
        apps = list(settings.INSTALLED_APPS)
    except Exception as exc:  # a settings module that does not import: ImportError, ImproperlyConfigured...
        module = os.environ.get("DJANGO_SETTINGS_MODULE", "?")
        raise SettingsError(f"DJANGO_SETTINGS_MODULE={module}: {type(exc).__name__}: {exc}") from None
    return any(app == APP or app.startswith(APP + ".apps.") for app in apps)


def options() -> dict[str, Any]:
    """``settings.POSTBOX`` with upper-case keys; :class:`SettingsError` when it is not a dict."""
    settings = _django_settings()
    raw = getattr(settings, "POSTBOX", None) if settings is not None else None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SettingsError(f"settings.POSTBOX must be a dict, got {type(raw).__name__}")
    return {str(key).upper(): value for key, value in raw.items()}


def values(fields: set[str]) -> dict[str, Any]:
    """Settings by field name: ``settings.POSTBOX``'s, then the derived database URL and task modules."""
    found: dict[str, Any] = {}
    for key, value in options().items():
        if key in DJANGO_ONLY:
            continue
        name = RENAMED.get(key, key.lower())
        if name not in fields or (name == "schema_name" and key != "SCHEMA"):
            raise SettingsError(
                f"settings.POSTBOX: unknown setting {key!r} (the settings are in docs/configuration.md)"
            )
        found[name] = value
    if "database_url" not in found:
        from django.conf import settings

        url = database_url(settings.DATABASES.get(database_alias()) or {})
        if url is not None:
            found["database_url"] = url
    if "tasks" not in found:
        modules = discovered_tasks()
        if modules:
            found["tasks"] = list(modules)
    return found


def database_alias() -> str:
    alias = options().get("DATABASE_ALIAS", "default")
    if not isinstance(alias, str):
        raise SettingsError(f"settings.POSTBOX['DATABASE_ALIAS'] must be a DATABASES key, got {alias!r}")
    return alias


def migrate_with_django() -> bool:
    return bool(options().get("MIGRATE", True))


def schema_name() -> str:
    """The schema postbox uses in this project: ``POSTBOX_SCHEMA``, else ``settings.POSTBOX["SCHEMA"]``."""
    name = os.environ.get("POSTBOX_SCHEMA") or options().get("SCHEMA") or schema.active()
    return schema.validate(name)


def database_url(settings_dict: Mapping[str, Any]) -> str | None:
    """A libpq URL for a ``DATABASES`` entry; ``None`` unless its engine is PostgreSQL's (or PostGIS's)."""
    engine = str(settings_dict.get("ENGINE") or "")
    if not engine.endswith((".postgresql", ".postgis")):
        return None
    user, password = settings_dict.get("USER") or "", settings_dict.get("PASSWORD") or ""
    host, port = str(settings_dict.get("HOST") or ""), str(settings_dict.get("PORT") or "")
    query = {
        key: str(value)
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if key in LIBPQ_OPTIONS and isinstance(value, str | int)
    }
    if host.startswith("/"):  # a Unix socket folder
        query["host"], host = host, ""
    elif ":" in host:
        host = f"[{host}]"
    credentials = ""
    if user:
        credentials = quote(str(user), safe="") + (":" + quote(str(password), safe="") if password else "") + "@"
    location = host + (f":{port}" if port else "")
    name = quote(str(settings_dict.get("NAME") or ""), safe="")
    return f"postgresql://{credentials}{location}/{name}" + (f"?{urlencode(query)}" if query else "")


@functools.cache
def discovered_tasks() -> tuple[str, ...]:
    """Every installed app's ``tasks`` module, once Django's app registry is ready (else none)."""
    from django.apps import apps

    if not apps.ready:
        return ()
    found = []
    for app_config in apps.get_app_configs():
        name = f"{app_config.name}.tasks"
        if app_config.name != APP and importlib.util.find_spec(name) is not None:
            found.append(name)
    return tuple(found)
