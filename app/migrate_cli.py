"""``postbox migrate``: bring postbox's own schema to the latest revision.

Creates nothing outside that schema (``POSTBOX_SCHEMA``, default ``postbox``),
where postbox keeps its own alembic version table. ``--sql`` prints the DDL
instead of running it, for teams that apply migrations with their own tool.

A PostgreSQL that does not answer within ``POSTBOX_START_TIMEOUT``, or refuses
the connection (a missing database), is one line naming the URL, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox import migrate
from postbox.errors import SettingsError
from postbox.settings import load_settings
from postbox.startup import wait_for_postgres


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="postbox migrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--revision", default="head", help="target revision (default: head)")
    parser.add_argument("--downgrade", action="store_true", help="downgrade to --revision instead")
    parser.add_argument("--sql", action="store_true", help="print the upgrade's DDL; change nothing")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
        url = settings.database_url or "postgresql://offline" if args.sql else settings.require_database_url()
    except SettingsError as exc:
        print(f"postbox migrate: {exc}", file=sys.stderr)
        return 2
    if args.sql:
        if args.downgrade:
            print("postbox migrate: --sql prints upgrades only", file=sys.stderr)
            return 2
        sys.stdout.write(migrate.upgrade_sql(url, args.revision))
        return 0
    failure = wait_for_postgres(url, settings.start_timeout)
    if failure is not None:
        print(f"postbox migrate: {failure}", file=sys.stderr)
        return 2
    if args.downgrade:
        migrate.downgrade(url, args.revision if args.revision != "head" else "base")
    else:
        migrate.upgrade(url, args.revision)
    target = args.revision if args.downgrade else migrate.head_revision()
    print(f"postbox migrate: schema {settings.schema_name} at {target}")
    return 0
