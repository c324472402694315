"""Django's connections in a worker: closed or recycled around each sync job, as around a request.

Django opens one connection per thread and closes it at the end of a request
(``close_old_connections`` on ``request_started`` / ``request_finished``): a
connection older than ``CONN_MAX_AGE`` or left unusable is closed, the rest are
kept. A worker's sync handlers run on threads of their own
(:mod:`postbox.worker.threads`), which no request cycle ever reaches, so a
worker kept one idle connection per thread it ever started. The same call is
made on the handler's own thread (the thread-local connection is that
thread's) before and after each sync job, through
:func:`postbox.hooks.in_handler_thread`. Async handlers reach the ORM through
``sync_to_async``, whose threads are Django's and asgiref's.
"""

from __future__ import annotations

from postbox import hooks


def close_old() -> None:
    """Close this thread's Django connections that are obsolete (``CONN_MAX_AGE``) or unusable."""
    from django.db import close_old_connections

    close_old_connections()


def register() -> None:
    """Call :func:`close_old` around every sync job of this process (idempotent)."""
    hooks.in_handler_thread(close_old)
