"""`make demo`: the showcase run on the embedded default (filled in as features land)."""

from __future__ import annotations

import sys


def main() -> int:
    print("demo: the emulator, router and replayer land with their issues", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
