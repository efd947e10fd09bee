"""Pickers: turn weighted total scores into the ranked list (head serves, tail fails over)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import Picker
from policies.params import BuildContext
from policies.types import Candidate, RequestInfo
from turnout.common.schema import Reader


@dataclass(frozen=True, slots=True)
class MaxScorePicker:
    """Highest total first; equal totals keep the candidates' (configuration) order."""

    def pick(self, req: RequestInfo, scored: Sequence[tuple[Candidate, float]]) -> list[str]:
        order = sorted(range(len(scored)), key=lambda i: -scored[i][1])
        return [scored[i][0].name for i in order]


@dataclass(slots=True)
class RoundRobinPicker:
    """Rotates the head through the candidates, one step per request; scores are ignored.

    The rotation follows the candidates' order, and the tail keeps that order after the head,
    so the failover order is the next backends in turn. The turn moves on when a request is
    sent (:meth:`committed`), so picking again for a request that waited changes nothing.
    """

    _turn: int = 0

    def pick(self, req: RequestInfo, scored: Sequence[tuple[Candidate, float]]) -> list[str]:
        return self.rotate([c.name for c, _ in scored], len(scored))

    def rotate(self, names: Sequence[str], limit: int) -> list[str]:
        """The next head, then up to ``limit`` names in all in turn after it."""
        n = len(names)
        if not n:
            return []
        start = self._turn % n
        if limit >= n:
            return [*names[start:], *names[:start]]
        # Two slices, not a step per name: a sampled ranking's worth of names from ``start``.
        window = list(names[start : start + limit])
        if len(window) < limit:  # past the end: the rest from the start
            window += names[: limit - len(window)]
        return window

    def committed(self, req: RequestInfo, candidates: Sequence[Candidate], backend: str) -> None:
        self._turn += 1


def make_max_score(p: Reader, ctx: BuildContext) -> Picker:
    """``max-score``: no params."""
    p.done()
    return MaxScorePicker()


def make_round_robin(p: Reader, ctx: BuildContext) -> Picker:
    """``round-robin``: no params."""
    p.done()
    return RoundRobinPicker()
