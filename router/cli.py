"""`router` console script (serve, check-config)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point; the router lands with its own issue."""
    print("router: not yet", file=sys.stderr)
    return 1
