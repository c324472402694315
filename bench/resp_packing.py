"""``python -m postbox_bench.resp_packing``: postbox's RESP packing against hiredis's, per command.

Prints one row per encoder and command: the best of five timings of 200,000
packs, in microseconds per command, and checks that both give the same bytes.
It decided what ``postbox.resp`` packs itself (the relay's XADD, of nine fields
then, of the three-field envelope now) and what it leaves to
``hiredis.pack_command`` (everything else).
"""

from __future__ import annotations

import sys
import timeit
from collections.abc import Callable

import hiredis

from postbox import resp
from postbox.streams import entry_meta

KEY = b"postbox:{mail}:p5"
ARGS = b'{"order_id": 123456, "email": "someone@example.com"}'
HEADERS = b'{"request_id": "abc"}'
FIELDS = (1764650000000, 1764650000123)


def ours_xadd() -> bytes:
    return resp.xadd_entry(
        KEY, job_id=123456789, task=b"send_tickets", args=ARGS, headers=HEADERS, attempt=1,
        queue=b"mail", priority=5, enqueued_ms=FIELDS[0], published_ms=FIELDS[1],
    )  # fmt: skip


def hiredis_xadd() -> bytes:
    meta = entry_meta(123456789, 1, 5, FIELDS[0], FIELDS[1], b"mail", b"send_tickets")
    packed: bytes = hiredis.pack_command((b"XADD", KEY, b"*", b"m", meta, b"a", ARGS, b"h", HEADERS))
    return packed


def handwritten_xack() -> bytes:
    """The encoder postbox used before hiredis packed its generic commands."""
    parts = (b"XACK", KEY, b"workers", b"1764650000000-0", b"1764650000001-0")
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in parts)


def hiredis_xack() -> bytes:
    return resp.command(b"XACK", KEY, b"workers", b"1764650000000-0", b"1764650000001-0")


def best_us(func: Callable[[], bytes], number: int = 200_000) -> float:
    return min(timeit.repeat(func, number=number, repeat=5)) / number * 1e6


def main() -> int:
    assert ours_xadd() == hiredis_xadd() and handwritten_xack() == hiredis_xack()
    rows = [
        ("XADD, envelope", "postbox.resp.xadd_entry", best_us(ours_xadd)),
        ("XADD, envelope", "hiredis.pack_command", best_us(hiredis_xadd)),
        ("XACK, 2 ids", "hand-written encoder", best_us(handwritten_xack)),
        ("XACK, 2 ids", "hiredis.pack_command", best_us(hiredis_xack)),
    ]
    print(f"{'command':16} {'encoder':26} {'µs/command':>10}")
    for name, encoder, micros in rows:
        print(f"{name:16} {encoder:26} {micros:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
