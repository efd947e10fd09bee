"""Load signals read from candidate snapshots, with the router-side fallback.

Scraped engine figures and router-side counts measure different things, so one ranking
never mixes them: a signal uses the engines' scraped figure only when every candidate has
a fresh one, and otherwise the router's own counts for all of them. A stale or missing
scrape therefore discounts itself: it switches that decision to the router-side view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from policies.types import Candidate, EngineLoad


def _scraped_or_router(
    candidates: Sequence[Candidate],
    scraped: Callable[[EngineLoad], float | None],
    router_side: Callable[[Candidate], float],
) -> dict[str, float]:
    values: dict[str, float] = {}
    for c in candidates:
        v = scraped(c.load) if c.load is not None and not c.load.stale else None
        if v is None:
            return {c.name: router_side(c) for c in candidates}
        values[c.name] = v
    return values


def inflight(candidates: Sequence[Candidate]) -> dict[str, float]:
    """Router-side open requests per backend."""
    return {c.name: float(c.inflight) for c in candidates}


def outstanding_tokens(candidates: Sequence[Candidate]) -> dict[str, float]:
    """Router-side outstanding prompt + output tokens per backend."""
    return {c.name: float(c.outstanding_tokens) for c in candidates}


def queue_depths(candidates: Sequence[Candidate]) -> dict[str, float]:
    """Requests waiting per backend: the engines' ``waiting`` gauge, else router in-flight."""
    return _scraped_or_router(candidates, lambda load: load.waiting, lambda c: c.inflight)


def memory_pressure(candidates: Sequence[Candidate]) -> dict[str, float]:
    """KV-cache usage per backend (fraction), else router-side outstanding tokens."""
    return _scraped_or_router(
        candidates, lambda load: load.kv_cache_usage, lambda c: c.outstanding_tokens
    )


def lower_is_better(values: Mapping[str, float]) -> dict[str, float]:
    """Min-max scale so the lowest value scores 1 and the highest 0 (all equal: all 1)."""
    if not values:
        return {}
    low = min(values.values())
    span = max(values.values()) - low
    if span <= 0:
        return dict.fromkeys(values, 1.0)
    return {k: 1.0 - (v - low) / span for k, v in values.items()}
