"""The operator services: the logic behind the REST API, the dashboard and the admin CLI.

One module per noun — :mod:`postbox.app.services.jobs`, ``queues``, ``workers``,
``dlq``, ``limits``, ``schedules``, ``audit`` — each taking an open psycopg
``AsyncConnection`` (and, where Redis is read, an async Redis client) and
returning frozen dataclasses, so the API and the CLI show the same thing.
Refusals are the typed errors of :mod:`postbox.app.services.errors`: a code, a
message and details, no HTTP status (``app/api/errors.py`` maps each class to
one, the CLI to an exit code).
"""
