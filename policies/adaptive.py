"""The ``adaptive`` policy: class-aware, load- and SLO-aware routing between engine pools.

* Interactive requests go to the low-TTFT pool, unless its best predicted TTFT is over the
  interactive SLO and the high-throughput pool predicts better; then that pool comes first.
* Batch requests go to the high-throughput pool, and spill onto a low-TTFT replica only
  while (a) every high-throughput replica already holds ``min_high_inflight`` requests and
  the batch is predicted to finish sooner on the low-TTFT replica (its predicted TTFT plus
  the output budget at its learned time per output token) than at the high-throughput
  pool's observed batch pace, (b) an interactive request arriving
  next would still be predicted under ``headroom`` x its TTFT SLO, and (c) the replica holds
  fewer spilled batch requests than the spill limit. The limit adapts to the interactive SLO
  attainment seen on the low-TTFT pool (policies/spill.py). Spilled requests on
  priority-capable replicas carry ``Decision.priority`` (a low priority) so the engine
  schedules interactive work first; their prefill then delays an interactive request by at
  most one prefill budget instead of a whole prompt.
* Inside a pool: the replica the router last sent most of the prompt's head to, while it is
  not saturated (the cache-aware index and gate of ``policies/prefix.py``), else the
  session/prefix home (bounded-load rendezvous hashing), then shortest predicted TTFT. The
  ranking always holds every healthy candidate (pools in preference order, then any backend
  of another engine kind); no healthy candidate: empty ranking.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.affinity import affinity_key, home
from policies.candidates import healthy as healthy_of
from policies.candidates import position_of
from policies.params import BuildContext, engine_kinds, read_slo
from policies.predictor import (
    PaceTracker,
    TpotTracker,
    TtftPredictor,
    queued_prefill_tokens,
    read_predictor,
    read_tpot,
)
from policies.prefix import DEFAULT_IMBALANCE, PrefixIndex
from policies.sampling import Sampling, draw_pools, read_sampling
from policies.spill import (
    SpillGovernor,
    SpillNotes,
    SpillSettings,
    queued_share,
    queueing,
    read_spill,
)
from policies.types import (
    Candidate,
    Decision,
    Lesson,
    Outcome,
    RequestClass,
    RequestInfo,
    Slo,
    group_of,
)
from turnout.common.schema import Reader

# How fast the typical interactive prompt size (used for the headroom check) follows traffic.
_PROMPT_ALPHA = 0.1


@dataclass(frozen=True, slots=True)
class AdaptiveSettings:
    """Validated ``adaptive`` params."""

    slo: dict[RequestClass, Slo]
    low_ttft: frozenset[str]
    high_throughput: frozenset[str]
    spill: SpillSettings
    load_bound: float = 1.25
    typical_prompt_tokens: float = 1000.0


@dataclass(slots=True)
class AdaptivePolicy:
    """See the module docstring. ``choose`` is synchronous and does no I/O.

    ``Decision.scores`` holds each backend's predicted TTFT for this request, in seconds
    (lower is better), for the debugging endpoints.
    """

    reads_prefix: ClassVar[bool] = True
    shares_placement: ClassVar[bool] = True
    shares_learning: ClassVar[bool] = True
    shares_spills: ClassVar[bool] = True

    name: str
    settings: AdaptiveSettings
    predictor: TtftPredictor
    tpot: TpotTracker
    pace: PaceTracker
    engines: dict[str, str]
    """Configured backend name -> engine kind, for outcomes of backends not in the last
    snapshot (a discovered replica is looked up by :func:`~policies.types.group_of`)."""
    type: str = "adaptive"
    governor: SpillGovernor = field(init=False)
    typical_prompt: float = field(init=False)
    spills: SpillNotes = field(default_factory=SpillNotes)
    """The spilled requests open per backend."""
    cache: PrefixIndex = field(default_factory=PrefixIndex)
    """Where prompt prefixes were sent, to keep a request on its cache-warm replica."""
    sampling: Sampling = field(default_factory=lambda: Sampling(None))
    """Above how many candidates each engine pool is read as a sample (policies/sampling.py)."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _pools: tuple[frozenset[str], ...] = field(init=False)
    """The configured names of the low-TTFT pool, the high-throughput pool and the rest."""

    @property
    def slo(self) -> Mapping[RequestClass, Slo]:
        """The class targets its requests are judged against (:class:`policies.base.Judged`)."""
        return self.settings.slo

    def __post_init__(self) -> None:
        self.governor = SpillGovernor(self.settings.spill)
        self.typical_prompt = self.settings.typical_prompt_tokens
        low, high = self.settings.low_ttft, self.settings.high_throughput
        self._pools = (
            frozenset(n for n, e in self.engines.items() if e in low),
            frozenset(n for n, e in self.engines.items() if e in high),
            frozenset(n for n, e in self.engines.items() if e not in low | high),
        )

    # -- choose ---------------------------------------------------------------------------

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        """Rank the healthy candidates for ``req`` (what it learns waits for
        :meth:`committed`)."""
        healthy: Sequence[Candidate] = healthy_of(candidates)
        tails: list[list[str]] = [[], [], []]
        if self.sampling.applies(len(healthy)):
            nominated = self.cache.nominate(req)
            healthy, tails = draw_pools(healthy, self._pools, self.sampling, self.rng, nominated)
        ahead = {c.name: queued_prefill_tokens(c, self.typical_prompt) for c in healthy}
        predicted = {
            c.name: self.predictor.predict(c.name, ahead[c.name], req.prompt_tokens)
            for c in healthy
        }
        key = affinity_key(req)
        low = self._order(
            req, [c for c in healthy if c.engine in self.settings.low_ttft], predicted, key
        )
        high = self._order(
            req, [c for c in healthy if c.engine in self.settings.high_throughput], predicted, key
        )
        pooled = self.settings.low_ttft | self.settings.high_throughput
        rest = self._order(req, [c for c in healthy if c.engine not in pooled], predicted, key)
        priority = None
        spill: str | None = None
        if req.request_class == "interactive":
            ranked = self._interactive(req, low, high, ahead, predicted) + rest
        elif (target := self._spill_target(req, low, high, ahead, predicted)) is None:
            ranked = high + low + rest
        else:
            spill = target.name
            ranked = [target] + high + [c for c in low if c is not target] + rest
            priority = self.settings.spill.priority if target.priority_capable else None
        memo = _Chosen(candidates, healthy, ahead, spill)
        low_tail, high_tail, rest_tail = tails
        tail = low_tail + high_tail if req.request_class == "interactive" else high_tail + low_tail
        names = (*(c.name for c in ranked), *tail, *rest_tail)
        return Decision(names, priority=priority, scores=predicted, memo=memo)

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        """The request goes to ``backend`` on ``decision`` (one of :meth:`choose`'s): note
        the predictions to score when it finishes, the spill, and where its prefix went."""
        chosen = decision.memo
        if not isinstance(chosen, _Chosen):
            return
        for name in self.spills.backends():  # only where spill notes are kept
            if (i := position_of(chosen.candidates, name)) is not None:
                self.spills.reconcile(chosen.candidates[i])
        self.predictor.note(req, chosen.ahead, decision.scores)
        if chosen.spill == backend:
            self.spills.note(("", req.request_id), backend, req.prompt_tokens)
        self.cache.observe(req, chosen.healthy)
        self.cache.record(backend, req.prefix_blocks)

    def _order(
        self,
        req: RequestInfo,
        pool: list[Candidate],
        predicted: dict[str, float],
        key: bytes | None,
    ) -> list[Candidate]:
        """Shortest predicted TTFT first, with the cache-warm replica (policies/prefix.py),
        else the affinity home (if any), ahead of all."""
        pool.sort(key=lambda c: predicted[c.name])
        if len(pool) > 1:
            warm = self.cache.warmest(req, pool, DEFAULT_IMBALANCE)
            target = warm.name if warm is not None else None
            if target is None and key is not None:
                target = home(key, pool, self.settings.load_bound)
            pool.sort(key=lambda c: c.name != target)
        return pool

    def _interactive_ahead(self, c: Candidate, ahead: dict[str, float]) -> float:
        """Prefill tokens an interactive request would wait behind on ``c``.

        On a priority-capable replica it jumps the spilled (low-priority) batch prompts, but
        may still wait for one prefill budget's worth of them already in progress.
        """
        spilled = self.spills.tokens(c.name)
        if not c.priority_capable or not spilled:
            return ahead[c.name]
        budget = self.settings.spill.priority_prefill_tokens
        return max(0.0, ahead[c.name] - spilled) + min(spilled, budget)

    def _interactive_ttft(
        self, req: RequestInfo, c: Candidate, ahead: dict[str, float], predicted: dict[str, float]
    ) -> float:
        """The TTFT predicted for an interactive ``req`` on ``c`` (``predicted``'s unless it
        jumps spilled batch prompts there)."""
        waits = self._interactive_ahead(c, ahead)
        if waits == ahead[c.name]:
            return predicted[c.name]
        return self.predictor.predict(c.name, waits, req.prompt_tokens)

    def _interactive(
        self,
        req: RequestInfo,
        low: list[Candidate],
        high: list[Candidate],
        ahead: dict[str, float],
        predicted: dict[str, float],
    ) -> list[Candidate]:
        if not low or not high:
            return low + high
        best_low = min(self._interactive_ttft(req, c, ahead, predicted) for c in low)
        best_high = min(predicted[c.name] for c in high)
        if best_low > self.settings.slo["interactive"].ttft_s and best_high < best_low:
            return high + low
        return low + high

    def _spill_target(
        self,
        req: RequestInfo,
        low: list[Candidate],
        high: list[Candidate],
        ahead: dict[str, float],
        predicted: dict[str, float],
    ) -> Candidate | None:
        """The low-TTFT replica that takes this batch request, if spilling is allowed."""
        spill = self.settings.spill
        if not low:
            return None
        if not high:
            return low[0]  # nothing else can serve it; still mark it low priority
        if not spill.enabled:
            return None
        if any(c.inflight < spill.min_high_inflight or not queueing(c) for c in high):
            return None  # the high-throughput pool still has room of its own: no borrowing
        # Finish times from measurement only. The home pool's is its observed batch pace
        # (end-to-end seconds per output token, queueing and prefill included): until it has
        # finished a batch request nothing is borrowed. A low-TTFT replica's is its own
        # observed batch pace once a spilled request has finished there; before that it takes
        # probes, no more than ``initial_inflight`` at once (the limit trusted before anything
        # is measured), and only while its TTFT and TPOT learned from interactive streams say
        # a probe would finish sooner, so it is measured within the first few spills.
        paces = [self.pace.pace(c.name) for c in high]
        if any(p is None for p in paces):
            return None
        out = req.expected_output_tokens
        # A spill also shortens the home backend's queue for the requests left there. Were a
        # request's time there T0 + b x (requests in flight), taking one away would cost it
        # (T0 / T) / T of throughput, so a spill pays while it finishes under T x T / T0 =
        # T / (1 - q), q the share of T spent waiting for prefill: by Little's law the share
        # of its requests waiting by the scrape. The credit is at most ``pace_margin``, and
        # only a measured pace on the low-TTFT replica gets it (a probe's estimate must win
        # on its own).
        home = min(high, key=lambda c: self.pace.pace(c.name) or 0.0)
        high_finish = (self.pace.pace(home.name) or 0.0) * out
        credit = min(spill.pace_margin, 1 / max(1e-9, 1 - queued_share(home)))
        slo_ttft = self.settings.slo["interactive"].ttft_s
        for c in low:
            if c.saturated or self.spilled(c.name) >= self.governor.allowed:
                continue
            pace = self.pace.pace(c.name)
            if pace is None:
                probing = self.spilled(c.name)
                if probing >= spill.initial_inflight or not self.tpot.measured(c.name):
                    continue  # enough probes are running, or nothing is measured yet
                finish = predicted[c.name] + out * self.tpot.tpot(c.name)
                beat = high_finish
            else:
                finish, beat = pace * out, high_finish * credit
            if finish >= beat:
                continue
            own = (
                min(req.prompt_tokens, spill.priority_prefill_tokens)
                if c.priority_capable
                else req.prompt_tokens
            )
            next_interactive = self.predictor.predict(
                c.name, self._interactive_ahead(c, ahead) + own, round(self.typical_prompt)
            )
            if next_interactive <= spill.headroom * slo_ttft:
                return c
        return None

    # -- bookkeeping ----------------------------------------------------------------------

    def prediction_error(self) -> dict[str, float]:
        """Per backend, the TTFT predictor's mean absolute percentage error (a ratio) over
        its recent streamed requests (see :meth:`TtftPredictor.error`)."""
        return self.predictor.error()

    def spilled(self, backend: str) -> int:
        """Spilled batch requests currently open on ``backend`` (for debugging endpoints)."""
        return self.spills.count(backend)

    def forget(self, backend: str) -> None:
        """Drop the figures learned of ``backend`` (:class:`policies.base.Forgets`); its open
        spill records go as their requests finish."""
        for learned in (self.predictor, self.tpot, self.pace, self.cache):
            learned.forget(backend)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """Learn prefill rates, release spill slots, and track interactive attainment."""
        lesson = self.predictor.observe(req, backend, outcome)
        self.spills.forget(("", req.request_id))
        if outcome.ok:
            self.cache.record(backend, req.prefix_blocks)
        self._learn(lesson)

    def lesson(self, req: RequestInfo, backend: str, outcome: Outcome) -> Lesson | None:
        """What ``req``'s outcome teaches the router's other processes
        (:class:`policies.base.SharesLearning`): None for a backend not configured here."""
        if group_of(backend) not in self.engines:
            return None
        return self.predictor.lesson(req, backend, outcome)

    def taught(self, lesson: Lesson) -> None:
        """Learn from a request another process of the router served (its TTFT was predicted
        and scored there)."""
        if group_of(lesson.backend) in self.engines:
            self.predictor.learn(lesson)
            self._learn(lesson)

    def spill(self, request_id: str) -> tuple[str, int] | None:
        """Where this process's ``request_id`` is spilled, and its prompt tokens, while open
        (:class:`policies.base.SharesSpills`)."""
        return self.spills.of(("", request_id))

    def spill_opened(self, origin: str, request_id: str, backend: str, prompt_tokens: int) -> None:
        """Another worker of the router spilled ``request_id`` to ``backend``."""
        if origin and group_of(backend) in self.engines:
            self.spills.note((origin, request_id), backend, prompt_tokens)

    def spill_closed(self, origin: str, request_id: str) -> None:
        """Another worker's spilled ``request_id`` finished."""
        self.spills.forget((origin, request_id))

    def learn(self, backend: str, blocks: Sequence[int]) -> None:
        """Another router process sent a prompt of ``blocks`` to ``backend``
        (:class:`policies.base.SharesPlacement`)."""
        self.cache.record(backend, blocks)

    def _learn(self, lesson: Lesson) -> None:
        """What every process learns from a finished request, beside the TTFT line."""
        self.tpot.learn(lesson)
        self.pace.learn(lesson)
        if lesson.request_class != "interactive" or not lesson.stream:
            return  # a non-streamed response has no observable TTFT
        if lesson.prompt_tokens:
            self.typical_prompt += _PROMPT_ALPHA * (lesson.prompt_tokens - self.typical_prompt)
        if self.engines.get(group_of(lesson.backend)) in self.settings.low_ttft:
            self.governor.record(self.settings.slo["interactive"].met(lesson.outcome))


@dataclass(frozen=True, slots=True)
class _Chosen:
    """What :meth:`AdaptivePolicy.choose` hands its ``committed`` (``Decision.memo``)."""

    candidates: Sequence[Candidate]
    healthy: Sequence[Candidate]
    ahead: Mapping[str, float]
    """Prefill tokens queued per healthy backend, as predicted from."""
    spill: str | None
    """The low-TTFT backend a batch request is spilled to, if it is."""


def make_adaptive(name: str, p: Reader, ctx: BuildContext) -> AdaptivePolicy:
    """Build ``adaptive`` from its params (documented in docs/policies.md, `adaptive`)."""
    slo = read_slo(p.child("slo"))
    low = engine_kinds(p, ctx, "low_ttft")
    high = engine_kinds(p, ctx, "high_throughput")
    for kind in sorted(low & high):
        p.error("high_throughput", f"{kind!r} is also listed in low_ttft")
    settings = AdaptiveSettings(
        slo=slo,
        low_ttft=low,
        high_throughput=high,
        spill=read_spill(p.child("spill")),
        load_bound=p.number("load_bound", 1.25, low=1.0),
        typical_prompt_tokens=p.number("typical_prompt_tokens", 1000.0, low=1.0),
    )
    predictor = read_predictor(p, ctx)
    tpot = read_tpot(p, ctx, predictor.alpha)
    sampling = read_sampling(p, ctx.failover)
    p.done()
    engines = {b.name: b.engine for b in ctx.backends}
    pace = PaceTracker(predictor.alpha)
    cache = PrefixIndex(backends=frozenset(engines))
    return AdaptivePolicy(
        name,
        settings,
        predictor,
        tpot,
        pace,
        engines,
        cache=cache,
        sampling=sampling,
        rng=random.Random(name),
    )
