"""What plugin factories build against: the configured backends, and their params' shapes.

Factories read their params through the one config reader, :class:`turnout.common.schema.Reader`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from policies.base import NullObserver, PipelineObserver
from policies.types import REQUEST_CLASSES, BackendInfo, RequestClass, Slo
from turnout.common.schema import Reader, join, unknown


@dataclass(frozen=True, slots=True)
class BuildContext:
    """The configured backends, and resolution of names/engine kinds against them."""

    backends: tuple[BackendInfo, ...]
    observer: PipelineObserver = field(default_factory=NullObserver)
    """Where pipeline policies report each plugin's run time and each emptied candidate set."""
    failover: int | None = None
    """The most backends one request is tried on (the router's ``failover.max_attempts``),
    which is all of a sampled ranking anyone walks; None: not known."""

    @property
    def engines(self) -> tuple[str, ...]:
        """Engine kinds in configuration order, without repeats."""
        return tuple(dict.fromkeys(b.engine for b in self.backends))

    def resolve(self, p: Reader, key: str, entries: Sequence[str]) -> list[list[str]]:
        """Each entry -> the backend names it means, in configuration order.

        An entry is an engine kind (every backend of that kind) or a backend name. Unknown
        entries are errors at ``key[i]``; an entry naming backends already listed earlier is
        an error too, since a backend can hold only one place in an ordering.
        """
        out: list[list[str]] = []
        taken: set[str] = set()
        for i, entry in enumerate(entries):
            names = [b.name for b in self.backends if b.engine == entry] or [
                b.name for b in self.backends if b.name == entry
            ]
            if not names:
                known = sorted({*self.engines, *(b.name for b in self.backends)})
                p.error(join(key, i), unknown(entry, known, "backend or engine"))
                continue
            if taken.intersection(names):
                p.error(join(key, i), f"{entry!r} repeats a backend listed before it")
                continue
            taken.update(names)
            out.append(names)
        return out


def class_orders(p: Reader, ctx: BuildContext) -> dict[RequestClass, list[list[str]]]:
    """Params ``{interactive: [...], batch: [...]}`` -> per class, tiers of backend names.

    Every class must be listed (so no request class is silently left without backends);
    entries are backend names or engine kinds, in preference order.
    """
    out: dict[RequestClass, list[list[str]]] = {}
    for cls in REQUEST_CLASSES:
        entries = p.string_list(cls, required=True, non_empty=True)
        if entries is not None:
            out[cls] = ctx.resolve(p, cls, entries)
    p.done()
    return out


DEFAULT_SLO: tuple[tuple[RequestClass, Slo], ...] = (
    ("interactive", Slo(ttft_s=1.0, tpot_s=0.1)),
    ("batch", Slo(ttft_s=60.0, tpot_s=1.0)),
)


def read_slo(p: Reader) -> dict[RequestClass, Slo]:
    """Per class, its ``ttft_s`` and ``tpot_s`` targets (:data:`DEFAULT_SLO` where unset)."""
    slo: dict[RequestClass, Slo] = {}
    for cls, default in DEFAULT_SLO:
        c = p.child(cls)
        slo[cls] = Slo(
            ttft_s=c.number("ttft_s", default.ttft_s, low=0.001),
            tpot_s=c.number("tpot_s", default.tpot_s, low=0.0001),
        )
        c.done()
    p.done()
    return slo


def engine_kinds(p: Reader, ctx: BuildContext, key: str) -> frozenset[str]:
    """``key``: a non-empty list of the configured engine kinds."""
    kinds = p.string_list(key, required=True, non_empty=True) or []
    for i, kind in enumerate(kinds):
        if kind not in ctx.engines:
            p.error(f"{key}[{i}]", unknown(kind, ctx.engines, "engine"))
    return frozenset(kinds)
