"""Scorers: a number in [0, 1] per candidate, higher is better; the pipeline weights them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from policies.base import Scorer
from policies.params import BuildContext, Params, class_orders
from policies.signals import (
    inflight,
    lower_is_better,
    memory_pressure,
    outstanding_tokens,
    queue_depths,
)
from policies.types import Candidate, RequestClass, RequestInfo


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

    tiers: dict[RequestClass, dict[str, float]]

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        table = self.tiers.get(req.request_class, {})
        return {c.name: table.get(c.name, 0.0) for c in candidates}


def make_least_requests(p: Params, ctx: BuildContext) -> Scorer:
    """``least-requests``: fewest router-side in-flight requests. No params."""
    p.done()
    return LoadScorer(inflight)


def make_least_tokens(p: Params, ctx: BuildContext) -> Scorer:
    """``least-tokens``: fewest outstanding prompt + output tokens. No params."""
    p.done()
    return LoadScorer(outstanding_tokens)


def make_queue_depth(p: Params, ctx: BuildContext) -> Scorer:
    """``queue-depth``: fewest waiting requests (scraped, else router in-flight). No params."""
    p.done()
    return LoadScorer(queue_depths)


def make_kv_cache(p: Params, ctx: BuildContext) -> Scorer:
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


def make_class_affinity(p: Params, ctx: BuildContext) -> Scorer:
    """``class-affinity``: ``{interactive: [...], batch: [...]}``, names or engine kinds."""
    return class_affinity(class_orders(p, ctx))
