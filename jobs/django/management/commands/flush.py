"""``manage.py flush`` that empties postbox's tables with Django's.

Django's ``flush`` empties the tables of Django's models only; postbox's jobs,
their history, schedules and the rest stayed, so a ``TransactionTestCase``
(``@pytest.mark.django_db(transaction=True)``), which flushes after each test,
left its committed jobs to the next test, and to the next run with
``--keepdb`` / ``--reuse-db``. This command replaces Django's (an installed
app's command wins over Django's own): the same options, the same question,
then postbox's tables (:func:`postbox.django.database.flush`).
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.db import connections

from postbox.django import database


class Command(flush.Command):
    help = flush.Command.help + " With postbox.django installed: postbox's tables (jobs, history...) too."

    def handle(self, **options: Any) -> None:
        using = options["database"]
        if options["interactive"]:
            name = connections[using].settings_dict["NAME"]
            confirm = input(
                "You have requested a flush of the database.\n"
                f'This will IRREVERSIBLY DESTROY all data currently in the "{name}" database,\n'
                "postbox's jobs included, and return each table to an empty state.\n"
                "Are you sure you want to do this?\n\n"
                "    Type 'yes' to continue, or 'no' to cancel: "
            )
            if confirm != "yes":
                self.stdout.write("Flush cancelled.")
                return
        super().handle(**{**options, "interactive": False})
        database.flush(using)
