"""The one runner: healthy -> filters -> weighted scorers -> picker -> Decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from policies.base import Filter, Learner, Picker, Scorer
from policies.pickers import MaxScorePicker
from policies.types import Candidate, Decision, Outcome, RequestInfo


@dataclass(slots=True)
class PipelinePolicy:
    """A named policy composed of plugins.

    Unhealthy candidates are always dropped first, so when every backend is unhealthy the
    ranking is empty and the router answers 503 itself. Otherwise the ranking holds every
    candidate that survived the filters, best first.
    """

    name: str
    type: str
    filters: tuple[Filter, ...] = ()
    scorers: tuple[tuple[Scorer, float], ...] = ()
    picker: Picker = field(default_factory=MaxScorePicker)
    learners: tuple[Learner, ...] = field(init=False)

    def __post_init__(self) -> None:
        plugins: list[object] = [*self.filters, *(s for s, _ in self.scorers), self.picker]
        self.learners = tuple(p for p in plugins if isinstance(p, Learner))

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        """Rank the candidates for ``req``."""
        survivors: Sequence[Candidate] = [c for c in candidates if c.healthy]
        for f in self.filters:
            if not survivors:
                break
            survivors = f.filter(req, survivors)
        totals = dict.fromkeys((c.name for c in survivors), 0.0)
        for scorer, weight in self.scorers:
            for name, value in scorer.score(req, survivors).items():
                if name in totals:
                    totals[name] += weight * value
        ranked = self.picker.pick(req, [(c, totals[c.name]) for c in survivors])
        return Decision(ranked=tuple(ranked), scores=totals)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """Forward the outcome to every plugin that learns."""
        for learner in self.learners:
            learner.on_finish(req, backend, outcome)
