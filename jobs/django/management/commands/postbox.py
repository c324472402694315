"""``manage.py postbox <command> ...``: postbox's command line inside the Django project.

The same commands as ``postbox`` (``worker run``, ``relay run``, ``api run``,
``migrate [--sql]``, ``jobs``, ``dlq``...), with Django already set up by
``manage.py``: settings come from ``settings.POSTBOX`` and ``DATABASES`` below
the environment, task modules may use the ORM. The exit status is the command's.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

# manage.py's own options, read by Django before this command runs.
DJANGO_OPTIONS = ("--settings", "--pythonpath")


class Command(BaseCommand):
    help = "Run postbox's command line in this project: postbox worker run, relay run, api run, migrate..."
    requires_system_checks = ()
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("words", nargs="*", help="a postbox command and its options, e.g. worker run")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every word after `postbox` is postbox's (its own --help too), but manage.py's options.
        words: list[str] = []
        skip = False
        for word in argv[2:]:
            if skip:
                skip = False
            elif word in DJANGO_OPTIONS:
                skip = True
            elif not word.startswith(tuple(option + "=" for option in DJANGO_OPTIONS)):
                words.append(word)
        sys.exit(run(words))

    def handle(self, *args: Any, **options: Any) -> None:
        code = run(list(options.get("words") or args))
        if code:
            raise CommandError(f"postbox {' '.join(options.get('words') or args)} exited with status {code}")


def run(words: list[str]) -> int:
    from postbox.app.cli import main

    return main(words)
