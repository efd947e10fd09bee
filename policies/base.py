"""The plugin protocols. Each is one method; plugins never do I/O, time or log themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from policies.types import Candidate, Decision, Outcome, RequestInfo


class Filter(Protocol):
    """Shrinks the candidate set (may return it unchanged, never adds)."""

    def filter(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Sequence[Candidate]: ...


class Scorer(Protocol):
    """Scores each candidate in [0, 1]; higher is better."""

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]: ...


class Picker(Protocol):
    """Turns weighted total scores into a ranked list of backend names."""

    def pick(self, req: RequestInfo, scored: Sequence[tuple[Candidate, float]]) -> list[str]: ...


class Policy(Protocol):
    """A named routing policy: ``choose`` is pure and synchronous; ``on_finish`` feeds back."""

    name: str
    type: str

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision: ...

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None: ...
