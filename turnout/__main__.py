"""``python -m turnout``: the same as the ``turnout`` command."""

import sys

from turnout.cli import main

sys.exit(main())
