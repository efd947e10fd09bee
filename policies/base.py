"""The plugin protocols. Each is one method; plugins never do I/O, time or log themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from policies.types import Candidate, Decision, Outcome, RequestInfo


@runtime_checkable
class Filter(Protocol):
    """Shrinks the candidate set (may return it unchanged, never adds)."""

    def filter(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Sequence[Candidate]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores each candidate in [0, 1]; higher is better."""

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]: ...


@runtime_checkable
class Picker(Protocol):
    """Turns weighted total scores into a ranked list of backend names."""

    def pick(self, req: RequestInfo, scored: Sequence[tuple[Candidate, float]]) -> list[str]: ...


@runtime_checkable
class Learner(Protocol):
    """A plugin that learns from finished requests (the pipeline forwards ``on_finish``)."""

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None: ...


@runtime_checkable
class Policy(Protocol):
    """A named routing policy: ``choose`` is pure and synchronous; ``on_finish`` feeds back."""

    name: str
    type: str

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision: ...

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None: ...
