"""``python -m router``: the same as the ``router`` console script."""

import sys

from router.cli import main

sys.exit(main())
