import sys

from postbox_examples.cli import main

sys.exit(main())
