"""``python -m postbox_bench.peers.run <peer>``: a peer's worker process (until SIGTERM)."""

from __future__ import annotations

import asyncio
import sys

from postbox_bench.peers.common import PeerConfig
from postbox_bench.peers.registry import adapter


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m postbox_bench.peers.run <pgqueuer|procrastinate|arq|saq>", file=sys.stderr)
        return 2
    peer = adapter(argv[0])
    try:
        import uvloop

        uvloop.run(peer.work(PeerConfig.from_env()))
    except ImportError:
        asyncio.run(peer.work(PeerConfig.from_env()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
