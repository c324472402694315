"""The Django app ``postbox.django`` (label ``postbox``): no models, signal handlers only."""

from __future__ import annotations

from django.apps import AppConfig


class PostboxConfig(AppConfig):
    name = "postbox.django"
    label = "postbox"
    verbose_name = "postbox"

    def ready(self) -> None:
        from postbox.django import connections, signals

        connections.register()
        signals.connect(self)
