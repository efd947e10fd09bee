"""The one runner: healthy -> filters -> weighted scorers -> picker -> Decision.

Plugins never time or log themselves; the runner does. It times each filter, scorer and
picker with one ``perf_counter`` pair and hands the seconds to its :class:`PipelineObserver`
(callables bound once, when the policy is built), clamps every score into [0, 1], and when
a filter removes every candidate it says which one, in the decision and to the observer.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from policies.base import (
    Commits,
    Filter,
    Forgets,
    Learner,
    Nominates,
    NullObserver,
    Picker,
    PipelineObserver,
    Scorer,
    SharesLearning,
    SharesPlacement,
)
from policies.candidates import healthy, names_of
from policies.pickers import MaxScorePicker, RoundRobinPicker
from policies.sampling import Drawn, Sampling, draw, draw_tiers
from policies.types import Candidate, Decision, Lesson, Outcome, RequestClass, RequestInfo

NO_HEALTHY = "no healthy candidate"

_Timer = Callable[[float], None]
_FilterRun = tuple[Filter, _Timer, Callable[[], None], str]


def plugin_type(plugin: object) -> str:
    """A type name derived from the plugin's class: ``ClassMembersFilter`` -> ``class-members``.

    Used for plugins built in code rather than from a configured ``type``.
    """
    cls = type(plugin).__name__
    stem = cls.removesuffix("Filter").removesuffix("Scorer").removesuffix("Picker") or cls
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", stem).lower()


def plugin_labels(types: Sequence[str], plugins: Sequence[object]) -> list[tuple[str, str]]:
    """Per plugin, (type name, metric label): the label gets the plugin's position in its
    list (``least-requests[1]``) when its type appears more than once there."""
    names = [
        types[i] if i < len(types) and types[i] else plugin_type(p) for i, p in enumerate(plugins)
    ]
    return [(n, f"{n}[{i}]" if names.count(n) > 1 else n) for i, n in enumerate(names)]


@dataclass(slots=True)
class PipelinePolicy:
    """A named policy composed of plugins.

    Unhealthy candidates are always dropped first, so when every backend is unhealthy the
    ranking is empty and the router answers 503 itself. Otherwise the ranking holds every
    candidate that survived the filters, best first. Each scorer's values are clamped into
    [0, 1] (NaN counts as 0) before they are weighted, so one misbehaving scorer cannot
    outvote the rest.
    """

    name: str
    type: str
    filters: tuple[Filter, ...] = ()
    scorers: tuple[tuple[Scorer, float], ...] = ()
    picker: Picker = field(default_factory=MaxScorePicker)
    observer: PipelineObserver = field(default_factory=NullObserver)
    """Receives each plugin's run time and each emptied candidate set (bound at build)."""
    filter_types: tuple[str, ...] = ()
    """Configured type names of ``filters``, for labels and messages; a missing or empty
    one is derived from the plugin's class (see :func:`plugin_type`)."""
    scorer_types: tuple[str, ...] = ()
    """Configured type names of ``scorers`` (as ``filter_types``)."""
    picker_type: str = ""
    """Configured type name of ``picker`` (as ``filter_types``)."""
    sampling: Sampling = field(default_factory=lambda: Sampling(None))
    """Above how many candidates to score a sample (policies/sampling.py); never by default."""
    tiers: Mapping[RequestClass, tuple[frozenset[str], ...]] | None = None
    """Per class, its tiers of configured names, each sampled on its own (``class-split``)."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    learners: tuple[Learner, ...] = field(init=False)
    committers: tuple[Commits, ...] = field(init=False)
    reads_prefix: bool = field(init=False)
    """A plugin reads the prompt's prefix (see :func:`policies.base.reads_prefix`)."""
    shares_placement: bool = field(init=False)
    """A plugin learns from the placements of other router processes (:meth:`learn`)."""
    _sharers: tuple[SharesPlacement, ...] = field(init=False)
    shares_learning: bool = field(init=False)
    """A plugin learns from the outcomes of other router processes (:meth:`taught`)."""
    _teachers: tuple[SharesLearning, ...] = field(init=False)
    _nominators: tuple[Nominates, ...] = field(init=False)
    _filter_runs: tuple[_FilterRun, ...] = field(init=False)
    _scorer_runs: tuple[tuple[Scorer, float, _Timer], ...] = field(init=False)
    _tiered_runs: tuple[tuple[Scorer, float, _Timer], ...] = field(init=False)
    """The scorers a ranking drawn by tier still needs: not those that only order tiers."""
    _pick_timer: _Timer = field(init=False)

    def __post_init__(self) -> None:
        plugins: list[object] = [*self.filters, *(s for s, _ in self.scorers), self.picker]
        self.learners = tuple(p for p in plugins if isinstance(p, Learner))
        self.committers = tuple(p for p in plugins if isinstance(p, Commits))
        self.reads_prefix = any(getattr(p, "reads_prefix", False) for p in plugins)
        self._sharers = tuple(p for p in plugins if isinstance(p, SharesPlacement))
        self.shares_placement = bool(self._sharers)
        self._teachers = tuple(p for p in plugins if isinstance(p, SharesLearning))
        self.shares_learning = bool(self._teachers)
        self._nominators = tuple(p for p in plugins if isinstance(p, Nominates))
        name, obs = self.name, self.observer
        self._filter_runs = tuple(
            (
                f,
                obs.plugin_timer(name, "filter", label),
                obs.filter_emptied(name, label),
                f"filter '{kind}' (filters[{i}]) removed every candidate",
            )
            for i, (f, (kind, label)) in enumerate(
                zip(self.filters, plugin_labels(self.filter_types, self.filters), strict=True)
            )
        )
        scorer_labels = plugin_labels(self.scorer_types, [s for s, _ in self.scorers])
        self._scorer_runs = tuple(
            (s, w, obs.plugin_timer(name, "scorer", label))
            for (s, w), (_, label) in zip(self.scorers, scorer_labels, strict=True)
        )
        self._tiered_runs = tuple(
            run for run in self._scorer_runs if not getattr(run[0], "orders_tiers", False)
        )
        ((_, picker_label),) = plugin_labels((self.picker_type,), (self.picker,))
        self._pick_timer = obs.plugin_timer(name, "picker", picker_label)

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        """Rank the candidates for ``req``."""
        clock = time.perf_counter
        survivors = healthy(candidates)
        if not survivors:
            return Decision((), empty_reason=NO_HEALTHY)
        for flt, timer, emptied, reason in self._filter_runs:
            t0 = clock()
            survivors = flt.filter(req, survivors)
            timer(clock() - t0)
            if not survivors:
                emptied()
                return Decision((), empty_reason=reason)
        if not self._scorer_runs and isinstance(self.picker, RoundRobinPicker):
            # Names only: rotating needs no snapshot (at most a sampled ranking's worth).
            n = len(survivors)
            limit = self.sampling.ranked if self.sampling.applies(n) else n
            t0 = clock()
            rotated = self.picker.rotate(names_of(survivors), limit)
            self._pick_timer(clock() - t0)
            return Decision(ranked=tuple(rotated), memo=survivors)
        drawn = self._draw(req, survivors)
        runs = self._scorer_runs
        if drawn is not None:
            survivors = drawn.scored
            if self.tiers is not None:  # the draw keeps the tiers' order itself
                runs = self._tiered_runs
        totals = dict.fromkeys((c.name for c in survivors), 0.0)
        for scorer, weight, timer in runs:
            t0 = clock()
            scores = scorer.score(req, survivors)
            timer(clock() - t0)
            for name, value in scores.items():
                if name in totals:
                    # Clamp into [0, 1]; NaN fails ``> 0`` and so counts as 0.
                    totals[name] += weight * (1.0 if value > 1.0 else value if value > 0.0 else 0.0)
        scored = [(c, totals[c.name]) for c in survivors]
        t0 = clock()
        ranked = self.picker.pick(req, scored)
        self._pick_timer(clock() - t0)
        ranking = drawn.ranking(ranked) if drawn is not None else tuple(ranked)
        return Decision(ranked=ranking, scores=totals, memo=survivors)

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        """Forward to every plugin that records its choices, with the candidates that
        survived the filters (those it was asked about)."""
        survivors = decision.memo
        if self.committers and isinstance(survivors, Sequence):
            for plugin in self.committers:
                plugin.committed(req, survivors, backend)

    def _draw(self, req: RequestInfo, survivors: Sequence[Candidate]) -> Drawn | None:
        """The sample to score, when there are more candidates than ``sampling`` scores."""
        if not self.sampling.applies(len(survivors)):
            return None
        if self.tiers is not None:
            tiers = self.tiers.get(req.request_class, ())
            return draw_tiers(survivors, tiers, self.sampling, self.rng)
        nominated = [name for n in self._nominators for name in n.nominate(req)]
        return draw(survivors, self.sampling, self.rng, nominated)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """Forward the outcome to every plugin that learns."""
        for learner in self.learners:
            learner.on_finish(req, backend, outcome)

    def learn(self, backend: str, blocks: Sequence[int]) -> None:
        """Forward to every plugin that shares its placements (:class:`SharesPlacement`)."""
        for plugin in self._sharers:
            plugin.learn(backend, blocks)

    def lesson(self, req: RequestInfo, backend: str, outcome: Outcome) -> Lesson | None:
        """The first learning plugin's lesson (:class:`SharesLearning`; they read one
        outcome alike but for what each noted queued ahead)."""
        return self._teachers[0].lesson(req, backend, outcome) if self._teachers else None

    def taught(self, lesson: Lesson) -> None:
        """Forward to every plugin that shares its learning."""
        for plugin in self._teachers:
            plugin.taught(lesson)

    def forget(self, backend: str) -> None:
        """Forward to every plugin that keeps figures per backend (:class:`Forgets`)."""
        for plugin in (*self.filters, *(s for s, _ in self.scorers), self.picker):
            if isinstance(plugin, Forgets):
                plugin.forget(backend)
