"""The operators' web dashboard, served by ``postbox api run`` at ``/``.

Plain HTML, CSS and JavaScript shipped in the package (``static/``): no build
step, nothing fetched from elsewhere. The page reads the REST API and the
events WebSocket; :mod:`.views` and :mod:`.bulk` add the reads and the bulk
actions it needs; :mod:`.session` keeps a server-side login session behind an HttpOnly cookie.
"""

from __future__ import annotations

from fastapi import FastAPI

from postbox.app.dashboard import bulk, routes, views
from postbox.app.dashboard.session import SessionCookie


def install(app: FastAPI) -> None:
    """Serve the dashboard on ``app`` (the API of :func:`postbox.app.api.main.create_app`)."""
    app.include_router(routes.router)
    app.include_router(views.router, prefix="/api/v1")
    app.include_router(bulk.router, prefix="/api/v1")
    app.add_middleware(SessionCookie)
