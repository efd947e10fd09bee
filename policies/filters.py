"""Filters: shrink the candidate set. (Unhealthy backends are dropped by the pipeline itself.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import Filter
from policies.candidates import in_groups
from policies.params import BuildContext, class_orders
from policies.types import Candidate, RequestClass, RequestInfo
from turnout.common.schema import Reader


@dataclass(frozen=True, slots=True)
class MembersFilter:
    """Keeps only the listed backends (and the replicas discovered behind them)."""

    names: frozenset[str]

    def filter(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        return in_groups(candidates, self.names)


@dataclass(frozen=True, slots=True)
class ClassMembersFilter:
    """Keeps only the backends listed for the request's class."""

    names: dict[RequestClass, frozenset[str]]

    def filter(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        return in_groups(candidates, self.names.get(req.request_class, frozenset()))


@dataclass(frozen=True, slots=True)
class NotSaturatedFilter:
    """Drops backends at their in-flight limit, unless that would drop every one.

    Keeping all of them when all are full leaves the decision to the router's admission
    queue, which sees ``Candidate.saturated`` itself.
    """

    def filter(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        open_ = [c for c in candidates if not c.saturated]
        return open_ or candidates


def make_members(p: Reader, ctx: BuildContext) -> Filter:
    """``members``: ``backends: [name or engine kind, ...]``."""
    entries = p.string_list("backends", required=True, non_empty=True) or []
    p.done()
    return MembersFilter(frozenset(n for tier in ctx.resolve(p, "backends", entries) for n in tier))


def make_class_members(p: Reader, ctx: BuildContext) -> Filter:
    """``class-members``: ``{interactive: [...], batch: [...]}``."""
    orders = class_orders(p, ctx)
    return ClassMembersFilter(
        {cls: frozenset(n for tier in tiers for n in tier) for cls, tiers in orders.items()}
    )


def make_not_saturated(p: Reader, ctx: BuildContext) -> Filter:
    """``not-saturated``: no params."""
    p.done()
    return NotSaturatedFilter()
