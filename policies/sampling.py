"""Scoring a few candidates of a large fleet instead of all of them (power of two choices).

A scoring policy that reads every candidate costs a snapshot and a score per backend, per
request. Up to ``sample_above`` candidates it still does; above it, it scores ``sample``
candidates drawn at random (two by default: the power of two choices, whose load stays
within a small constant of the best placement's while reading two backends instead of all),
plus any its plugins nominate (the prompt's cache-warm backends, for the cache-aware ones).
The ranking is then those by score, then the next candidates in turn from a random start
(names only, no snapshot) up to ``sample_above`` names in all: enough for failover, and for
passing over backends at their ``max_inflight``.

Where a policy's candidates come in tiers (``class-split``'s list order per class), each tier
is sampled on its own, in order, until the ranking is long enough, and the ranking keeps the
tiers' order, so a tier is still preferred whole to the next. The scorers that only order the
tiers (``orders_tiers``) are then not run: the draw's order is theirs already.

The draws come from the policy's own seeded generator, so a run in virtual time repeats.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policies.candidates import in_groups, names_of, position_of
from policies.types import Candidate
from turnout.common.schema import Reader

DEFAULT_ABOVE = 16
"""Candidates a policy scores all of: fleets up to this size are ranked exactly."""
DEFAULT_SAMPLE = 2


@dataclass(frozen=True, slots=True)
class Sampling:
    """The ``sample_above`` and ``sample`` params (``above`` None: never sample), and
    ``depth``: the most backends failover tries (None: not known)."""

    above: int | None = DEFAULT_ABOVE
    size: int = DEFAULT_SAMPLE
    depth: int | None = None

    def applies(self, n: int) -> bool:
        return self.above is not None and n > self.above

    @property
    def ranked(self) -> int:
        """Names a sampled ranking holds: the scored ones, then more up to what failover
        walks (``depth``), else up to ``sample_above``. Names past the failover order would
        be made for every request and read by none."""
        cap = self.above or 0
        if self.depth is not None:
            cap = min(cap, self.depth)
        return max(cap, self.size)


def read_sampling(p: Reader, depth: int | None = None) -> Sampling:
    """``sample_above`` (0: never sample, else at least ``sample``; default
    :data:`DEFAULT_ABOVE`) and ``sample`` (>= 1; default :data:`DEFAULT_SAMPLE`); ``depth``:
    :attr:`~policies.params.BuildContext.failover`."""
    above = p.integer("sample_above", DEFAULT_ABOVE, low=0)
    size = p.integer("sample", DEFAULT_SAMPLE, low=1)
    if above and size > above:
        p.error("sample", f"at most sample_above ({above})")
    return Sampling(above or None, size, depth)


def _below(rng: random.Random, n: int) -> int:
    """A position of ``n`` at random: ``randrange``'s three Python calls cost more than the
    rest of a draw, and ``n`` is far below 2**53, where scaling a float is as even."""
    return int(rng.random() * n)


def positions(rng: random.Random, n: int, k: int) -> list[int]:
    """``k`` distinct positions of ``n`` (all of them when ``k >= n``), at random."""
    if k >= n:
        return list(range(n))
    picked: list[int] = []
    while len(picked) < k:  # k is a few and n is many: a repeat is rare
        i = _below(rng, n)
        if i not in picked:
            picked.append(i)
    return picked


def in_turn(names: Sequence[str], start: int, skip: Iterable[str], count: int) -> list[str]:
    """Up to ``count`` of ``names`` from ``start`` on, wrapping, leaving out ``skip``."""
    left = set(skip)
    want = min(len(names), count + len(left))
    # Slices, not a step per name: this runs for every sampled request (issue 29's cost at
    # size), and ``want`` names from ``start`` can hold at most ``len(left)`` skipped ones.
    window = list(names[start : start + want])
    if len(window) < want:
        window += names[: want - len(window)]
    if left:
        window = [name for name in window if name not in left]
    return window[:count]


@dataclass(frozen=True, slots=True)
class Drawn:
    """What a sampled policy scores, and the names it ranks after them."""

    scored: list[Candidate]
    tail: list[str]
    tier: dict[str, int] | None = None
    """Per name, its tier (tiered candidates only): the ranking is kept in tier order."""

    def ranking(self, ranked: Sequence[str]) -> tuple[str, ...]:
        """``ranked`` (the scored candidates, best first), then the tail, in tier order."""
        out = [*ranked, *self.tail]
        if self.tier is not None:
            tier = self.tier
            out.sort(key=lambda name: tier[name])  # stable: best first within each tier
        return tuple(out)


def draw(
    candidates: Sequence[Candidate],
    sampling: Sampling,
    rng: random.Random,
    nominated: Iterable[str] = (),
    count: int | None = None,
) -> Drawn:
    """``sampling.size`` candidates at random plus the ``nominated`` names among them, and
    the ranking's tail; ``count``: names to draw instead of ``sampling.ranked``."""
    names = names_of(candidates)
    n = len(names)
    chosen = positions(rng, n, sampling.size)
    for name in nominated:
        i = position_of(candidates, name)
        if i is not None and i not in chosen:
            chosen.append(i)
    scored = [candidates[i] for i in chosen]
    room = (sampling.ranked if count is None else count) - len(scored)
    tail = in_turn(names, _below(rng, n), (c.name for c in scored), room) if room > 0 else []
    return Drawn(scored, tail)


def draw_tiers(
    candidates: Sequence[Candidate],
    tiers: Sequence[frozenset[str]],
    sampling: Sampling,
    rng: random.Random,
) -> Drawn:
    """:func:`draw` within each tier (configured names) until the ranking is long enough,
    the ranking in tier order. Most often the first tier fills it alone: its draw is then
    the ranking as it is (no tier per name, nothing to sort), and later tiers are not read."""
    parts: list[Drawn] = []
    room = sampling.ranked
    for groups in tiers:
        if room <= 0:
            break
        members = in_groups(candidates, groups)
        if not members:
            continue
        if sampling.applies(len(members)):
            part = draw(members, sampling, rng, count=room)
        else:
            part = Drawn(list(members[:room]), [])
        parts.append(part)
        room -= len(part.scored) + len(part.tail)
    if len(parts) == 1:
        return parts[0]
    tier = {c.name: t for t, part in enumerate(parts) for c in part.scored}
    tier.update((name, t) for t, part in enumerate(parts) for name in part.tail)
    return Drawn(
        [c for part in parts for c in part.scored], [n for part in parts for n in part.tail], tier
    )


def draw_pools(
    candidates: Sequence[Candidate],
    pools: Sequence[frozenset[str]],
    sampling: Sampling,
    rng: random.Random,
    nominated: Sequence[str] = (),
) -> tuple[list[Candidate], list[list[str]]]:
    """:func:`draw` within each pool of configured names that is larger than the sample
    (a smaller one is read whole): what to score, and each pool's tail."""
    scored: list[Candidate] = []
    tails: list[list[str]] = []
    for groups in pools:
        if not groups:  # adaptive's pool of other engine kinds, most often: no view to make
            tails.append([])
            continue
        members = in_groups(candidates, groups)
        if sampling.applies(len(members)):
            part = draw(members, sampling, rng, nominated)
            scored += part.scored
            tails.append(part.tail)
        else:
            scored += members
            tails.append([])
    return scored, tails
