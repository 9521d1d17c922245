"""``python -m orchestra``: the same command line as the ``orchestra`` script."""

import sys

from orchestra.cli import main

sys.exit(main())
