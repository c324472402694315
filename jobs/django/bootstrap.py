"""``django.setup()`` for postbox's processes, before their settings and task modules.

``postbox worker run`` (and ``relay run``, ``api run``) started with
``DJANGO_SETTINGS_MODULE`` in the environment sets Django up itself
(:func:`postbox.startup.process_settings` calls :func:`setup`): the task modules
it then imports may use the ORM, and ``settings.POSTBOX`` / ``DATABASES`` are
read as settings (:mod:`postbox.django.conf`). ``manage.py postbox ...`` has
Django set up already; :func:`setup` then does nothing.
"""

from __future__ import annotations

import os

from postbox.django import connections


def setup() -> str | None:
    """Set Django up from ``DJANGO_SETTINGS_MODULE``; the problem as one line, or ``None`` when done."""
    module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
    try:
        import django
        from django.apps import apps
    except ImportError:
        return f"DJANGO_SETTINGS_MODULE is set ({module}) but Django is not installed"
    if not apps.ready:
        try:
            django.setup()
        except Exception as exc:  # ImportError of the module, ImproperlyConfigured, an app's ready()...
            return f"DJANGO_SETTINGS_MODULE={module}: Django could not be set up: {type(exc).__name__}: {exc}"
    # Also without postbox.django in INSTALLED_APPS: its handler threads are Django's too.
    connections.register()
    return None
