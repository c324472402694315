"""No models: postbox's tables are its own schema's, migrated by postbox (:mod:`postbox.django.database`).

The module exists because Django sends ``post_migrate`` only to apps that have
one, and ``postbox.django`` answers that signal (:mod:`postbox.django.signals`).
"""
