"""``python -m worker run``."""

import sys

from worker.cli import main

sys.exit(main(sys.argv[1:]))
