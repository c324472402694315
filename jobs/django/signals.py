"""Django's signals that postbox answers: ``post_migrate`` brings postbox's schema to head."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from postbox.django import conf, database


def connect(app_config: AppConfig) -> None:
    # Sent once per installed app; sender= this app's config: once per migrate.
    post_migrate.connect(_migrated, sender=app_config, dispatch_uid="postbox.django.migrate")


def _migrated(sender: AppConfig, using: str = "default", verbosity: int = 1, **kwargs: Any) -> None:
    """After ``manage.py migrate`` (and a test database's creation or flush): postbox's schema at head."""
    if using != conf.database_alias() or not conf.migrate_with_django():
        return
    database.migrate(using, verbosity=verbosity, stdout=kwargs.get("stdout"))
