"""``python -m specwise``: the command line, where the ``specwise`` script is not installed."""

import sys

from specwise.cli import main

sys.exit(main())
