import sys

from postbox_bench.cli import main

sys.exit(main(sys.argv[1:]))
