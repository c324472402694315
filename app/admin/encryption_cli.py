"""``postbox encryption new-key|reencrypt``: keys of encrypted tasks (:mod:`postbox.encryption`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from postbox import encryption
from postbox.app.admin.common import EXIT_OK, Parser, Session, run, to_json
from postbox.app.services import sealing


def parser() -> Parser:
    p = Parser(prog="postbox encryption", description="Keys of encrypted tasks (POSTBOX_ENCRYPTION_KEYS).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    new = sub.add_parser("new-key", help="print a fresh random key (base64) to put in POSTBOX_ENCRYPTION_KEYS")
    new.add_argument("--kid", default="", help="print it as kid:key")
    again = sub.add_parser(
        "reencrypt", help="seal every stored args sealed under an older key under the first key (rotation)"
    )
    again.add_argument("--batch", type=int, default=500, help="rows per transaction")
    again.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def cmd_reencrypt(s: Session, a: argparse.Namespace) -> int:
    keys = encryption.keyring()
    done = await sealing.reseal(s.conn, keys, batch=max(1, a.batch))
    if a.json:
        print(to_json({"key": keys.current, "resealed": done.resealed, "changed": done.changed_meanwhile,
                       "failed": [{"id": i, "error": e} for i, e in done.failed]}))  # fmt: skip
    else:
        print(f"{done.resealed} rows sealed under key {keys.current!r}")
        if done.changed_meanwhile:
            print(f"{done.changed_meanwhile} rows changed meanwhile: run it again")
        for job_id, error in done.failed:
            print(f"job {job_id}: {error}", file=sys.stderr)
    return EXIT_OK if not done.failed else 1


def main(argv: Sequence[str]) -> int:
    if list(argv[:1]) == ["new-key"]:  # no database needed
        args = parser().parse_args(list(argv))
        key = encryption.new_key()
        print(f"{args.kid}:{key}" if args.kid else key)
        return EXIT_OK
    return run("postbox encryption", parser(), argv, {"reencrypt": cmd_reencrypt})
