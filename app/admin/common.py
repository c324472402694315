"""What every admin command shares: settings, connections, output (tables or JSON), errors, exit codes.

Exit codes: 0 done; 1 refused or failed (not found, conflict, a server down);
2 bad input (usage, invalid values) — in that case nothing was written.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

import orjson
import psycopg

from postbox import db, encryption, redis_conn, revision
from postbox.app.services.audit import Actor
from postbox.app.services.errors import InvalidInputError, ServiceError
from postbox.errors import EnqueueError, PostboxError, QueueFullError, SettingsError
from postbox.settings import Settings, load_settings
from postbox.startup import wait_for_postgres

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so ``main`` returns a code."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w``."""
    match = DURATION_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use seconds or 30m, 12h, 7d, 2w")
    return float(match.group(1)) * UNITS[match.group(2)]


def positive_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid job id {text!r}: a positive integer") from None
    if not 0 < value < 2**63:
        raise argparse.ArgumentTypeError(f"invalid job id {text!r}: a positive integer")
    return value


def cli_actor() -> Actor:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return Actor(f"cli:{user}")


def to_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str).decode()


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    text = str(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    if not rows:
        print("(none)", file=out)
        return
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=out)
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip(), file=out)


def details(item: dict[str, Any], out: TextIO, skip: Sequence[str] = ()) -> None:
    width = max(len(k) for k in item)
    for key, value in item.items():
        if key in skip:
            continue
        shown = to_json(value).replace("\n", " ") if isinstance(value, dict | list) else cell(value)
        print(f"{key.ljust(width)}  {shown}", file=out)


HISTORY_COLUMNS = ("life", "attempt", "worker_id", "started_at", "finished_at", "outcome", "error_class", "error")


def show_job(job: dict[str, Any], as_json: bool, out: TextIO) -> None:
    """One job (or dead letter): its fields, then one history row per attempt.

    An encrypted task's args and kept result are shown opened when this process has the key
    (``POSTBOX_ENCRYPTION_KEYS``), as the API shows them to a reader with the API key; else the envelope.
    """
    job = opened(job)
    if as_json:
        print(to_json(job), file=out)
        return
    details(job, out, skip=("history", "progress"))
    if job.get("progress") is not None:
        print(f"progress  {progress_text(job['progress'])}", file=out)
    print("\nhistory:", file=out)
    table(job["history"], HISTORY_COLUMNS, out)
    for entry in job["history"]:
        if entry.get("traceback"):
            heading = f"attempt {entry['attempt']} (life {entry['life']}) traceback:"
            print(f"\n{heading}\n{entry['traceback'].rstrip()}", file=out)


def opened(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with its sealed args and kept result opened where this process has the key (a note when not)."""
    job = dict(job)
    try:
        job["args"] = encryption.open_args(str(job.get("task")), job.get("args"))
    except encryption.EncryptionError as exc:
        print(f"postbox: job {job.get('id')}: its args stay sealed: {exc}", file=sys.stderr)
    if isinstance(job.get("id"), int):
        job["result"] = encryption.open_result(job["id"], job.get("result"))
    return job


def progress_text(value: dict[str, Any]) -> str:
    """``42/100 (42%) — note [attempt 2, 2026-12-02 10:00:00]``, or ``42 (total unknown)``."""
    done, total = value.get("done"), value.get("total")
    if isinstance(total, int | float) and total > 0 and isinstance(done, int | float):
        text = f"{done:g}/{total:g} ({min(100.0, 100 * done / total):.0f}%)"
    else:
        text = f"{done} (total unknown)"
    if value.get("note"):
        text += f" — {value['note']}"
    at = value.get("at")
    return f"{text} [attempt {value.get('attempt')}, {cell(at) if isinstance(at, datetime) else at}]"


def show_page(
    items: Sequence[dict[str, Any]], next_cursor: str | None, columns: Sequence[str], as_json: bool, out: TextIO
) -> None:
    """One page of a listing, with the flag that continues it."""
    if as_json:
        print(to_json({"items": items, "next_cursor": next_cursor}), file=out)
        return
    table(items, columns, out)
    if next_cursor:
        print(f"\nmore: --cursor {next_cursor}", file=out)


class Session:
    """The command's connections: PostgreSQL always, Redis when configured."""

    def __init__(self, settings: Settings, conn: psycopg.AsyncConnection[Any], redis: Any) -> None:
        self.settings = settings
        self.conn = conn
        self.redis = redis


Command = Callable[[Session, argparse.Namespace], Awaitable[int]]


async def _with_session(settings: Settings, command: Command, args: argparse.Namespace) -> int:
    conn = await psycopg.AsyncConnection.connect(
        settings.require_database_url(), autocommit=False, application_name="postbox-admin", connect_timeout=5
    )
    await db.ADMIN_BOUNDS.apply(conn)  # docs/operations.md#session-bounds
    redis = None
    if settings.redis_url:
        redis = redis_conn.connect(settings, socket_connect_timeout=2.0, socket_timeout=5.0)
    try:
        return await command(Session(settings, conn, redis), args)
    finally:
        if redis is not None:
            await redis.aclose()
        await conn.close()


def run(prog: str, parser: Parser, argv: Sequence[str], commands: Mapping[str, Command]) -> int:
    """Parse, connect, run the subcommand; print a clear message and return the exit code on error."""
    try:
        args = parser.parse_args(list(argv))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    try:
        settings = load_settings()
        failure = wait_for_postgres(settings.require_database_url(), settings.start_timeout)
        if failure is not None:
            print(f"{prog}: error: {failure}", file=sys.stderr)
            return EXIT_FAILED
        return asyncio.run(_with_session(settings, commands[args.command], args))
    except QueueFullError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (EnqueueError, UsageError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ServiceError as exc:  # bad input: 2; not found, conflict, confirmation required: 1
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, InvalidInputError) else EXIT_FAILED
    except SettingsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: error: cannot reach PostgreSQL: {reason}", file=sys.stderr)
        return EXIT_FAILED
    except revision.MISSING_OBJECT as exc:
        outdated = revision.missing_schema(exc)
        print(f"{prog}: error: {outdated or str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return EXIT_FAILED
    except psycopg.Error as exc:
        print(f"{prog}: error: database error: {str(exc).strip()}", file=sys.stderr)
        return EXIT_FAILED
    except PostboxError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
