"""Scorers: a number in [0, 1] per candidate, higher is better; the pipeline weights them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.affinity import affinity_key, home
from policies.base import Scorer
from policies.params import BuildContext, class_orders
from policies.predictor import TtftPredictor, queued_prefill_tokens, read_predictor
from policies.signals import (
    inflight,
    lower_is_better,
    memory_pressure,
    outstanding_tokens,
    queue_depths,
)
from policies.types import Candidate, Lesson, Outcome, RequestClass, RequestInfo, group_of
from turnout.common.schema import Reader


@dataclass(frozen=True, slots=True)
class LoadScorer:
    """Fewer is better, for one load signal (min-max scaled across the candidates)."""

    signal: Callable[[Sequence[Candidate]], Mapping[str, float]]

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        return lower_is_better(self.signal(candidates))


@dataclass(frozen=True, slots=True)
class ClassAffinityScorer:
    """Prefers the backends configured for the request's class, tier by tier.

    Tier ``i`` of ``n`` scores ``(n - i) / n``; backends not listed for the class score 0.
    """

    orders_tiers: ClassVar[bool] = True
    """Its scores only order the tiers: a policy that samples each tier and keeps the
    ranking in tier order (``class-split`` at size, policies/sampling.py) skips it."""

    tiers: dict[RequestClass, dict[str, float]]

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        table = self.tiers.get(req.request_class, {})
        return {c.name: table.get(group_of(c.name), 0.0) for c in candidates}


@dataclass(frozen=True, slots=True)
class PredictedTtftScorer:
    """Shorter predicted TTFT is better: ``target / (target + predicted)``.

    A learner: it notes its queue estimates for each request sent and learns each backend's
    prefill rate from the outcomes (see ``predictor.py``).
    """

    predictor: TtftPredictor
    target_s: float
    typical_prompt: float = 1000.0

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        ahead = self._ahead(candidates)
        return {
            c.name: self.target_s
            / (self.target_s + self.predictor.predict(c.name, ahead[c.name], req.prompt_tokens))
            for c in candidates
        }

    def committed(self, req: RequestInfo, candidates: Sequence[Candidate], backend: str) -> None:
        self.predictor.note(req, self._ahead(candidates))

    def _ahead(self, candidates: Sequence[Candidate]) -> dict[str, float]:
        return {c.name: queued_prefill_tokens(c, self.typical_prompt) for c in candidates}

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        self.predictor.observe(req, backend, outcome)

    def lesson(self, req: RequestInfo, backend: str, outcome: Outcome) -> Lesson | None:
        """What ``req`` teaches the router's other processes (policies.base.SharesLearning);
        None for a backend not configured here."""
        if group_of(backend) not in self.predictor.priors:
            return None
        return self.predictor.lesson(req, backend, outcome)

    def taught(self, lesson: Lesson) -> None:
        self.predictor.learn(lesson)

    def forget(self, backend: str) -> None:
        self.predictor.forget(backend)


@dataclass(frozen=True, slots=True)
class SessionAffinityScorer:
    """1 for the key's home replica in each engine pool (bounded load), else 0.

    Requests without a session key or prefix hash get no preference (all 0).
    """

    reads_prefix: ClassVar[bool] = True

    load_bound: float

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        scores = dict.fromkeys((c.name for c in candidates), 0.0)
        key = affinity_key(req)
        if key is not None:
            for engine in {c.engine for c in candidates}:
                target = home(key, [c for c in candidates if c.engine == engine], self.load_bound)
                if target is not None:
                    scores[target] = 1.0
        return scores


def make_predicted_ttft(p: Reader, ctx: BuildContext) -> Scorer:
    """``predicted-ttft``: ``target_s`` (default 1.0), ``prefill_rate_prior``, ``learning_rate``."""
    target = p.number("target_s", 1.0, low=0.001)
    predictor = read_predictor(p, ctx)
    p.done()
    return PredictedTtftScorer(predictor, target)


def make_session_affinity(p: Reader, ctx: BuildContext) -> Scorer:
    """``session-affinity``: ``load_bound`` (>= 1, default 1.25)."""
    bound = p.number("load_bound", 1.25, low=1.0)
    p.done()
    return SessionAffinityScorer(bound)


def make_least_requests(p: Reader, ctx: BuildContext) -> Scorer:
    """``least-requests``: fewest router-side in-flight requests. No params."""
    p.done()
    return LoadScorer(inflight)


def make_least_tokens(p: Reader, ctx: BuildContext) -> Scorer:
    """``least-tokens``: fewest outstanding prompt + output tokens. No params."""
    p.done()
    return LoadScorer(outstanding_tokens)


def make_queue_depth(p: Reader, ctx: BuildContext) -> Scorer:
    """``queue-depth``: fewest waiting requests (scraped, else router in-flight). No params."""
    p.done()
    return LoadScorer(queue_depths)


def make_kv_cache(p: Reader, ctx: BuildContext) -> Scorer:
    """``kv-cache``: lowest KV-cache usage (scraped, else outstanding tokens). No params."""
    p.done()
    return LoadScorer(memory_pressure)


def class_affinity(orders: Mapping[RequestClass, list[list[str]]]) -> ClassAffinityScorer:
    """The scorer for resolved per-class tiers."""
    return ClassAffinityScorer(
        {
            cls: {
                name: (len(tiers) - i) / len(tiers) for i, tier in enumerate(tiers) for name in tier
            }
            for cls, tiers in orders.items()
        }
    )


def make_class_affinity(p: Reader, ctx: BuildContext) -> Scorer:
    """``class-affinity``: ``{interactive: [...], batch: [...]}``, names or engine kinds."""
    return class_affinity(class_orders(p, ctx))
