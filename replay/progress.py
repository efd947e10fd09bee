"""The live progress line of a replay on a terminal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import IO

from replay.report import RunReport
from replay.runner import Runner


class Progress:
    """``sent / done / failed, elapsed / planned`` on one rewritten terminal line.

    ``planned`` is the schedule's length in seconds (open loop) or its request count (closed
    loop, where time is not planned).
    """

    def __init__(self, runner: Runner, report: RunReport, planned: str, label: str) -> None:
        self._runner = runner
        self._report = report
        self._planned = planned
        self._label = label

    def line(self, now: float) -> str:
        """The current progress text."""
        r = self._runner
        failed = self._report.overall.failed
        return (
            f"[{self._label}] sent {r.sent}  done {r.done}  failed {failed}  "
            f"elapsed {now - r.start:6.1f}s / planned {self._planned}"
        )

    async def run(self, out: IO[str], clock: Callable[[], float]) -> None:
        """Redraw every half second until cancelled."""
        try:
            while True:
                out.write("\r" + self.line(clock()))
                out.flush()
                await asyncio.sleep(0.5)
        finally:
            out.write("\r" + self.line(clock()) + "\n")
            out.flush()
