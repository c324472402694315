"""pgbench, run by the bench: custom scripts against the sandbox database, tps parsed from its report.

``pgbench`` comes with PostgreSQL's client tools (Debian: ``apt-get install
postgresql-client``). When it is not on PATH the scenarios that need it say so
(:data:`MISSING`) and skip those figures.

:func:`render` turns one of postbox's statements (``jobs/sql.py``, written for
psycopg's ``%(name)s`` parameters) into pgbench SQL: each parameter becomes
the literal or pgbench variable given for it, so the script runs the very text
the worker runs. A parameter the caller gives no value for is an error, not a
silent NULL: a statement that grew a parameter must be looked at.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MISSING = "pgbench not found on PATH (Debian/Ubuntu: apt-get install postgresql-client)"
_PARAM = re.compile(r"%\((\w+)\)s")
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)


def available() -> bool:
    return shutil.which("pgbench") is not None


def render(statement: str, values: Mapping[str, str]) -> str:
    """``statement`` with each ``%(name)s`` replaced by ``values[name]`` and ``%%`` by ``%``; ends with ``;``."""
    unknown = sorted({m.group(1) for m in _PARAM.finditer(statement)} - values.keys())
    if unknown:
        raise ValueError(f"statement has parameters the pgbench script gives no value for: {', '.join(unknown)}")
    text = _PARAM.sub(lambda m: values[m.group(1)], statement).replace("%%", "%")
    return text.strip().rstrip(";") + ";"


@dataclass(frozen=True)
class Result:
    tps: float
    transactions: int
    output: str


def run(database_url: str, script: str, *, clients: int, transactions: int | None = None, seconds: int = 0) -> Result:
    """Run ``script`` (pgbench syntax) with ``clients`` connections, ``-t transactions`` each or for ``seconds``.

    Prepared statements (``-M prepared``), as psycopg prepares a statement run
    often; no vacuum of pgbench's own tables (``-n``). Raises RuntimeError when
    pgbench fails or reports failed transactions.
    """
    if not available():
        raise RuntimeError(MISSING)
    with tempfile.TemporaryDirectory(prefix="postbox-pgbench-") as folder:
        path = Path(folder) / "script.sql"
        path.write_text(script, encoding="utf-8")
        argv = ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)), "-f", str(path)]
        argv += ["-t", str(transactions)] if transactions is not None else ["-T", str(max(1, seconds))]
        done = subprocess.run([*argv, database_url], capture_output=True, text=True, timeout=3600, check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"pgbench exited with {done.returncode}:\n{output[-2000:]}")
    failed = _FAILED.search(output)
    if failed is not None and int(failed.group(1)) > 0:
        raise RuntimeError(f"pgbench: {failed.group(1)} failed transactions:\n{output[-2000:]}")
    tps = _TPS.search(output)
    if tps is None:
        raise RuntimeError(f"pgbench printed no tps line:\n{output[-2000:]}")
    processed = re.search(r"^number of transactions actually processed: (\d+)", output, re.MULTILINE)
    return Result(float(tps.group(1)), int(processed.group(1)) if processed else 0, output)
