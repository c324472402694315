"""``postbox migrate``: upgrade the database to the latest schema."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jobs import migrate
from jobs.errors import SettingsError
from jobs.settings import load_settings


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="postbox migrate", description=__doc__)
    parser.add_argument("--revision", default="head", help="target revision (default: head)")
    parser.add_argument("--downgrade", action="store_true", help="downgrade to --revision instead")
    args = parser.parse_args(argv)
    try:
        url = load_settings().require_database_url()
    except SettingsError as exc:
        print(f"postbox migrate: {exc}", file=sys.stderr)
        return 2
    if args.downgrade:
        migrate.downgrade(url, args.revision if args.revision != "head" else "base")
    else:
        migrate.upgrade(url, args.revision)
    print(f"postbox migrate: database at {args.revision if args.downgrade else migrate.head_revision()}")
    return 0
