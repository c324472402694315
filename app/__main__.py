import sys

from postbox.app.cli import main

sys.exit(main())
