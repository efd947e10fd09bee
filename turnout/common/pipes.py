"""Command-line entry points that end quietly when their reader goes away."""

from __future__ import annotations

import functools
import os
import sys
from typing import Protocol

SIGPIPE_STATUS = 141
"""128 + SIGPIPE: what a shell reports for a tool its pipe's reader stopped (``| head``)."""


class Main(Protocol):
    def __call__(self, argv: list[str] | None = None) -> int: ...


def closes_quietly(main: Main) -> Main:
    """``main``, ending with :data:`SIGPIPE_STATUS` and no traceback when stdout's reader
    closes the pipe, as Unix tools do."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except BrokenPipeError:
            # The interpreter flushes stdout once more at exit; aimed at /dev/null, that
            # flush cannot fail a second time.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return SIGPIPE_STATUS

    return run
