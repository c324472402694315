"""``postbox api run``: serve the REST API with uvicorn.

Like the relay and the worker, it refuses to start (one line, exit 2) on bad
settings, PostgreSQL or Redis not answering within ``POSTBOX_START_TIMEOUT``, or
a postbox schema missing or older than this code (run ``postbox migrate``). A
schema that goes missing under a running API makes ``/ready`` answer 503 and
the routes answer ``503 SCHEMA_OUTDATED`` (docs/api.md).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from postbox import revision
from postbox.errors import SchemaOutdatedError, SettingsError, TaskModuleError
from postbox.settings import Settings
from postbox.startup import process_settings, run_loop, settle_collector


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="postbox api", description="The postbox REST API (FastAPI on uvicorn).")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve the API")
    run.add_argument("--host", help="address to bind (default: POSTBOX_API_HOST, 127.0.0.1)")
    run.add_argument("--port", type=int, help="port to bind (default: POSTBOX_API_PORT, 8000)")
    run.add_argument("--tasks", help="comma-separated task modules (default: POSTBOX_TASKS)")
    run.add_argument(
        "--root-path",
        default="",
        help="the path prefix a reverse proxy serves the API under, e.g. /postbox (the proxy strips it)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    from postbox.app.api.main import create_app

    return serve(argv, parser(), create_app)


def serve(argv: Sequence[str], arg_parser: argparse.ArgumentParser, factory: Callable[[Settings], Any]) -> int:
    """Parse ``api run`` options, build the app with ``factory(settings)`` and serve it until SIGTERM."""
    try:
        args = arg_parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return serve_parsed(args, arg_parser.prog, factory)


def serve_parsed(args: argparse.Namespace, prog: str, factory: Callable[[Settings], Any]) -> int:
    """Serve the app ``factory(settings)`` with the parsed ``--host``/``--port``/``--tasks``."""
    settings = process_settings("api", api_host=args.host or None, api_port=args.port, tasks=args.tasks)
    if settings is None:
        return 2
    try:
        run_loop(revision.require_at(settings.require_database_url()))
    except SchemaOutdatedError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    try:
        app = factory(settings)
    except TaskModuleError as exc:
        print(f"{exc.details}\n{prog}: {exc}", file=sys.stderr)
        return 2
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    root_path = str(getattr(args, "root_path", "") or "").rstrip("/")
    if root_path and not root_path.startswith("/"):
        print(f"{prog}: --root-path must start with /, got {root_path!r}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,
        access_log=False,  # logs.py silences uvicorn.access; off, uvicorn skips formatting each line
        proxy_headers=False,
        root_path=root_path,
    )
    server = _server_class()(config)
    settle_collector(settings.gc_threshold)
    server.run()
    return 0 if server.started else 1


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM/SIGINT end it gracefully with exit 0 (not re-raised)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server
