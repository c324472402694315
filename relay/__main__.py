"""``python -m postbox.relay run``."""

from __future__ import annotations

import sys

from postbox.relay.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
