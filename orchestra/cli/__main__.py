"""``python -m orchestra.cli``: the same command line as ``python -m orchestra`` and the ``orchestra`` script."""

import sys

from orchestra.cli import main

sys.exit(main())
