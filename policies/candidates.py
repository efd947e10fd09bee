"""Candidate sets kept between requests, whose snapshots are taken only when a policy reads them.

The router keeps, per model, the ordered set of backends that may serve it (a
:class:`CandidateSet`), and replaces it only when a backend's health, ejection, models or
membership change, so a request pays nothing per backend to get it. Each request reads it
through a :class:`Candidates` view: a ``Sequence[Candidate]`` whose snapshot of a backend
(in-flight figures, scraped load) is taken the first time the policy reads that position and
kept for the rest of the request. A policy that reads two candidates builds two snapshots,
whatever the fleet's size.

Filters by backend name (``members``, ``class-members``) are answered from subsets the set
keeps, each built once per set (:meth:`Candidates.subset`). Any other ``Sequence[Candidate]``
(a list, in tests and in code that builds its own) works everywhere a view does, at the
cost of touching each candidate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Protocol, overload

from policies.types import Candidate, group_of


class Source(Protocol):
    """A backend as a candidate set holds it: its name, and a snapshot of it now."""

    @property
    def name(self) -> str: ...

    def candidate(self) -> Candidate: ...


class CandidateSet:
    """An ordered set of backends, all offered as healthy; immutable once built.

    ``forced``: the backends are offered as healthy whatever their own state says (the
    router's panic mode: every backend of a model is out).
    """

    __slots__ = ("_subsets", "forced", "index", "names", "sources")

    def __init__(self, sources: Sequence[Source], *, forced: bool = False) -> None:
        self.sources: tuple[Source, ...] = tuple(sources)
        self.names: tuple[str, ...] = tuple(s.name for s in self.sources)
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self.forced = forced
        self._subsets: dict[frozenset[str], CandidateSet] = {}

    def subset(self, groups: frozenset[str]) -> CandidateSet:
        """The members whose configured name (:func:`group_of`) is in ``groups``, in order;
        built on first use, then kept as long as this set is."""
        found = self._subsets.get(groups)
        if found is None:
            kept = [s for s in self.sources if group_of(s.name) in groups]
            found = self._subsets[groups] = CandidateSet(kept, forced=self.forced)
        return found

    def view(self) -> Candidates:
        """A fresh view for one request (its snapshots are its own)."""
        return Candidates(self)


class Candidates(Sequence[Candidate]):
    """One request's view of a :class:`CandidateSet` (see the module docstring)."""

    __slots__ = ("_memo", "members")

    def __init__(self, members: CandidateSet) -> None:
        self.members = members
        self._memo: dict[int, Candidate] = {}

    def __len__(self) -> int:
        return len(self.members.names)

    @overload
    def __getitem__(self, i: int) -> Candidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...

    def __getitem__(self, i: int | slice) -> Candidate | list[Candidate]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        c = self._memo.get(i)
        if c is None:
            c = self.members.sources[i].candidate()
            if self.members.forced and not c.healthy:
                c = replace(c, healthy=True)
            self._memo[i] = c
        return c

    def __iter__(self) -> Iterator[Candidate]:
        for i in range(len(self)):
            yield self[i]

    @property
    def names(self) -> tuple[str, ...]:
        """The members' names, in order, without taking any snapshot."""
        return self.members.names

    @property
    def snapshots(self) -> int:
        """How many snapshots this view has taken so far (what a request cost per backend)."""
        return len(self._memo)

    def subset(self, groups: frozenset[str]) -> Candidates:
        """A view of the members under ``groups`` (see :meth:`CandidateSet.subset`); the
        snapshots already taken carry over."""
        sub = Candidates(self.members.subset(groups))
        names, index = self.members.names, sub.members.index
        for i, c in self._memo.items():
            j = index.get(names[i])
            if j is not None:
                sub._memo[j] = c
        return sub


def healthy(candidates: Sequence[Candidate]) -> Sequence[Candidate]:
    """The healthy ones: a view as it is (its members are healthy by construction)."""
    if isinstance(candidates, Candidates):
        return candidates
    return [c for c in candidates if c.healthy]


def names_of(candidates: Sequence[Candidate]) -> Sequence[str]:
    """The candidates' names, without snapshots when ``candidates`` is a view."""
    if isinstance(candidates, Candidates):
        return candidates.names
    return [c.name for c in candidates]


def position_of(candidates: Sequence[Candidate], name: str) -> int | None:
    """Where ``name`` is among the candidates (None: not there)."""
    if isinstance(candidates, Candidates):
        return candidates.members.index.get(name)
    return next((i for i, c in enumerate(candidates) if c.name == name), None)


def in_groups(candidates: Sequence[Candidate], groups: frozenset[str]) -> Sequence[Candidate]:
    """The candidates whose configured name is in ``groups``, in order."""
    if isinstance(candidates, Candidates):
        return candidates.subset(groups)
    return [c for c in candidates if group_of(c.name) in groups]
