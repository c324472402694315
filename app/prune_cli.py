"""``postbox prune``: delete finished jobs, old idempotency markers and expired results.

Retention comes from ``POSTBOX_RETENTION_FINISHED_DAYS``,
``POSTBOX_RETENTION_PROCESSED_DAYS`` and ``POSTBOX_PRUNE_BATCH_SIZE``; dead
letters are never pruned (``postbox dlq discard`` + ``postbox dlq purge``).
Safe to run while producers and workers run: small batches, one short
transaction each. Run it from cron, or let the leading relay do it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import psycopg

from postbox import retention
from postbox.errors import SettingsError
from postbox.settings import load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postbox prune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    parser.add_argument("--max-batches", type=int, default=None, help="stop after this many batches (default: all)")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (POSTBOX_PRUNE_BATCH_SIZE)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    overrides: dict[str, Any] = {}
    if args.batch_size is not None:
        overrides["prune_batch_size"] = args.batch_size
    if args.max_batches is not None and args.max_batches < 1:
        print("postbox prune: --max-batches must be >= 1", file=sys.stderr)
        return 2
    try:
        settings = load_settings(**overrides)
        url = settings.require_database_url()
    except SettingsError as exc:
        print(f"postbox prune: {exc}", file=sys.stderr)
        return 2
    with psycopg.connect(url, autocommit=True, application_name="postbox-prune") as conn:
        report = retention.prune(conn, settings, dry_run=args.dry_run, max_batches=args.max_batches)
    if args.json:
        print(json.dumps(report.as_dict()))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    print(
        f"postbox prune: {verb} {report.finished} finished jobs "
        f"(older than {settings.retention_finished_days:g} days), "
        f"{report.processed} processed_jobs markers (older than {settings.retention_processed_days:g} days), "
        f"{report.results} expired results, {report.limits} stale flow-control rows"
        + ("" if args.dry_run else f", in {len(report.batches)} batches")
        + ("" if report.complete else "; stopped at --max-batches, more remain")
    )
    return 0
