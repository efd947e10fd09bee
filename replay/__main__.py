"""`replay` console script."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point; the replayer lands with its own issue."""
    print("replay: not yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
