"""Which backends serve each model, kept between requests rather than found per request.

A request's candidates used to be found by walking every backend (its models, its health),
so each request cost a few microseconds per backend of the fleet. :class:`ServingSets`
keeps, per model, the answer of one such walk (a :class:`Serving`) until something it
depends on changes: a backend's health, ejection, models, context length or spec, the
backends themselves, or the aliases. The pool calls :meth:`ServingSets.clear` on each such
change (they are rare next to requests), and the next request for a model walks once.

The same is kept per configured backend name, for what shadowing sends to (its replicas: the
healthy ones, else all of them; :meth:`ServingSets.group`).

One change is not an event: an ejected backend's cooldown running out (its breaker lets a
probe through from then on). Each kept answer holds the earliest such moment among its
backends, and is walked again once the clock passes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.candidates import CandidateSet
from policies.types import group_of

if TYPE_CHECKING:
    from router.backends.pool import BackendState

DEFAULT_CONTEXT_TOKENS = 131_072
"""A context length for engines that report none (the common 128 Ki of current models)."""

Aliases = Mapping[str, Mapping[str, str]]
UpstreamModel = Callable[["BackendState", str], "str | None"]


@dataclass(frozen=True, slots=True)
class Serving:
    """The backends of one model, as of the last change."""

    members: CandidateSet
    """What policies are offered: the healthy ones, else (panic) all of them as healthy."""
    backends: tuple[BackendState, ...]
    """The same backends, as the router's objects."""
    served: int
    """How many backends can serve the model at all, healthy or not."""
    panic: bool
    context: int
    """The smallest context length its backends report (:data:`DEFAULT_CONTEXT_TOKENS`)."""
    wake: float
    """When an ejected backend's cooldown ends: the answer is found again from then on."""


class ServingSets:
    """Kept answers per model name (see the module docstring).

    Only names some backend lists, and the aliases, get their own answer; every other name
    a client sends shares one (the backends that list no models serve any name), so what
    clients send cannot grow it.
    """

    def __init__(self, upstream_model: UpstreamModel, clock: Callable[[], float]) -> None:
        self._upstream_model = upstream_model
        self._clock = clock
        self._sets: dict[str | None, Serving] = {}
        self._groups: dict[str, Serving] = {}
        self._named: frozenset[str] | None = None

    def clear(self) -> None:
        """Something a kept answer depends on changed."""
        self._sets.clear()
        self._groups.clear()
        self._named = None

    @property
    def named(self) -> frozenset[str]:
        """The model names kept apart (valid after :meth:`ids` or :meth:`get`)."""
        return self._named or frozenset()

    def ids(self, backends: Iterable[BackendState], aliases: Aliases) -> frozenset[str]:
        """Every model some backend lists, and every alias."""
        if self._named is None:
            self._named = frozenset({m for b in backends for m in b.models} | set(aliases))
        return self._named

    def get(self, model: str, backends: Sequence[BackendState], aliases: Aliases) -> Serving:
        key = model if model in self.ids(backends, aliases) else None
        found = self._sets.get(key)
        if found is None or found.wake <= self._clock():
            found = self._sets[key] = self._find(model, backends)
        return found

    def group(self, name: str, backends: Sequence[BackendState]) -> Serving:
        """The backends configured name ``name`` stands for (itself, or its discovered
        replicas: :func:`~policies.types.group_of`), kept like a model's. Only configured
        names are asked for (shadow targets), so this stays as small as the config."""
        found = self._groups.get(name)
        if found is None or found.wake <= self._clock():
            found = self._groups[name] = _found([b for b in backends if group_of(b.name) == name])
        return found

    def _find(self, model: str, backends: Sequence[BackendState]) -> Serving:
        return _found([b for b in backends if self._upstream_model(b, model) is not None])


def _found(serving: Sequence[BackendState]) -> Serving:
    """The answer for the backends that can serve something (healthy or not)."""
    healthy = [b for b in serving if b.healthy]
    panic = not healthy and bool(serving)
    offered = serving if panic else healthy
    known = [b.context_tokens for b in serving if b.context_tokens is not None]
    wake = min((t for b in serving if (t := b.breaker.reopens_at) is not None), default=math.inf)
    return Serving(
        CandidateSet(offered, forced=panic),
        tuple(offered),
        len(serving),
        panic,
        min(known, default=DEFAULT_CONTEXT_TOKENS),
        wake,
    )
