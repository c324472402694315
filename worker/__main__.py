"""``python -m postbox.worker run``."""

import sys

from postbox.worker.cli import main

sys.exit(main(sys.argv[1:]))
