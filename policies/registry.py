"""The one table of built-in policy types and plugins, and ``build_policy``.

A policy entry in config is ``type`` + ``params``. Built-in types are listed in
``POLICY_TYPES``; any other type (and any filter/scorer/picker ``type`` inside a
``pipeline``) may be an out-of-tree ``"module:attr"`` string:

* a policy factory is called as ``attr(name, params, backends)`` and returns a ``Policy``;
* a plugin factory is called as ``attr(params, backends)`` and returns the plugin.

Both raise ``ValueError`` for bad params; the message is reported at the entry's path.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar, cast

from policies import adaptive, filters, pd, pickers, prefix, scorers
from policies.base import Filter, NullObserver, Picker, PipelineObserver, Policy, Scorer
from policies.params import BuildContext, class_orders
from policies.pipeline import PipelinePolicy
from policies.sampling import read_sampling
from policies.signals import inflight, outstanding_tokens
from policies.types import BackendInfo
from turnout.common.schema import Errors, Reader, join, unknown

__all__ = ["BackendInfo", "PolicyConfigError", "build_policy", "policy_types"]

T = TypeVar("T")
PluginFactory = Callable[[Reader, BuildContext], T]
PolicyFactory = Callable[[str, Reader, BuildContext], Policy]


class PolicyConfigError(ValueError):
    """Every problem found in one policy entry, each as (path within the entry, message)."""

    def __init__(self, errors: Errors) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(f"{path}: {message}" for path, message in self.errors))


def _class_split(name: str, p: Reader, ctx: BuildContext) -> Policy:
    sampling = read_sampling(p, ctx.failover)
    orders = class_orders(p, ctx)
    tiers = max((len(t) for t in orders.values()), default=1) or 1
    # Tiers are 1/tiers apart, so a load tie-breaker weighted below that can only reorder
    # replicas inside one tier, never promote a later tier.
    return PipelinePolicy(
        name,
        "class-split",
        filters=(
            filters.ClassMembersFilter(
                {cls: frozenset(n for tier in t for n in tier) for cls, t in orders.items()}
            ),
        ),
        scorers=(
            (scorers.class_affinity(orders), 1.0),
            (scorers.LoadScorer(inflight), 0.5 / tiers),
        ),
        observer=ctx.observer,
        sampling=sampling,
        tiers={cls: tuple(frozenset(tier) for tier in t) for cls, t in orders.items()},
        rng=random.Random(name),
    )


def _subset(p: Reader, ctx: BuildContext) -> tuple[Filter, ...]:
    entries = p.string_list("backends", non_empty=True)
    if entries is None:
        return ()
    names = frozenset(n for tier in ctx.resolve(p, "backends", entries) for n in tier)
    return (filters.MembersFilter(names),)


def _round_robin(name: str, p: Reader, ctx: BuildContext) -> Policy:
    subset = _subset(p, ctx)
    sampling = read_sampling(p, ctx.failover)
    p.done()
    return PipelinePolicy(
        name,
        "round-robin",
        filters=subset,
        picker=pickers.RoundRobinPicker(),
        observer=ctx.observer,
        sampling=sampling,
    )


def _least_outstanding(name: str, p: Reader, ctx: BuildContext) -> Policy:
    by = p.choice("by", ("requests", "tokens"), "requests")
    subset = _subset(p, ctx)
    sampling = read_sampling(p, ctx.failover)
    p.done()
    signal = inflight if by == "requests" else outstanding_tokens
    return PipelinePolicy(
        name,
        "least-outstanding",
        filters=subset,
        scorers=((scorers.LoadScorer(signal), 1.0),),
        observer=ctx.observer,
        sampling=sampling,
        rng=random.Random(name),
    )


def _cache_aware(name: str, p: Reader, ctx: BuildContext) -> Policy:
    index, imbalance = prefix.read_index(p, ctx, None)
    subset = _subset(p, ctx)
    sampling = read_sampling(p, ctx.failover)
    p.done()
    return prefix.CacheAwarePolicy(
        name, index, imbalance, subset, sampling=sampling, rng=random.Random(name)
    )


def _pinned(name: str, p: Reader, ctx: BuildContext) -> Policy:
    backend, engine = p.string("backend"), p.string("engine")
    sampling = read_sampling(p, ctx.failover)
    p.done()
    names: frozenset[str] = frozenset()
    if (backend is None) == (engine is None):
        p.error("backend", "give exactly one of 'backend' (a name) or 'engine' (a kind)")
    elif backend is not None:
        names = frozenset(b.name for b in ctx.backends if b.name == backend)
        if not names:
            p.error("backend", unknown(backend, [b.name for b in ctx.backends], "backend"))
    elif engine is not None:
        names = frozenset(b.name for b in ctx.backends if b.engine == engine)
        if not names:
            p.error("engine", unknown(engine, ctx.engines, "engine"))
    return PipelinePolicy(
        name,
        "pinned",
        filters=(filters.MembersFilter(names),),
        scorers=((scorers.LoadScorer(inflight), 1.0),),
        observer=ctx.observer,
        sampling=sampling,
        rng=random.Random(name),
    )


FILTERS: Mapping[str, PluginFactory[Filter]] = MappingProxyType(
    {
        "members": filters.make_members,
        "class-members": filters.make_class_members,
        "not-saturated": filters.make_not_saturated,
    }
)
SCORERS: Mapping[str, PluginFactory[Scorer]] = MappingProxyType(
    {
        "least-requests": scorers.make_least_requests,
        "least-tokens": scorers.make_least_tokens,
        "queue-depth": scorers.make_queue_depth,
        "kv-cache": scorers.make_kv_cache,
        "class-affinity": scorers.make_class_affinity,
        "predicted-ttft": scorers.make_predicted_ttft,
        "session-affinity": scorers.make_session_affinity,
        "cache-aware": prefix.make_cache_aware,
    }
)
PICKERS: Mapping[str, PluginFactory[Picker]] = MappingProxyType(
    {"max-score": pickers.make_max_score, "round-robin": pickers.make_round_robin}
)


def _plugin(
    entry: object,
    path: str,
    table: Mapping[str, PluginFactory[T]],
    proto: type,
    ctx: BuildContext,
    errors: Errors,
    *,
    weighted: bool = False,
) -> tuple[T, float] | None:
    """One ``{type, params[, weight]}`` entry (a bare string means no params)."""
    spec = Reader.of({"type": entry} if isinstance(entry, str) else entry, path, errors)
    kind = spec.string("type", required=True)
    weight = spec.number("weight", 1.0, low=0.0) if weighted else 1.0
    raw_params = spec.raw_value("params")
    spec.done()
    if kind is None:
        return None
    params_path = join(path, "params")
    if kind in table:
        return table[kind](Reader.of(raw_params, params_path, errors), ctx), weight
    if ":" not in kind:
        spec.error("type", unknown(kind, table, "plugin type"))
        return None
    factory = _load_external(kind, join(path, "type"), errors)
    if factory is None:
        return None
    try:
        built = factory(raw_params or {}, ctx.backends)
    except (ValueError, TypeError) as exc:  # bad params, or a factory of the wrong shape
        errors.append((params_path, str(exc)))
        return None
    if not isinstance(built, proto):
        spec.error("type", f"{kind!r} did not return a {proto.__name__}")
        return None
    return cast(T, built), weight


def _load_external(ref: str, path: str, errors: Errors) -> Callable[..., object] | None:
    module_name, _, attr = ref.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # importing runs the module's code: report whatever it raises
        errors.append((path, f"cannot load {ref!r}: {exc}"))
        return None
    if not callable(target):
        errors.append((path, f"{ref!r} is not callable"))
        return None
    factory: Callable[..., object] = target
    return factory


def _pipeline(name: str, p: Reader, ctx: BuildContext) -> Policy:
    def type_of(entry: object) -> str:
        kind = entry.get("type") if isinstance(entry, Mapping) else entry
        return kind if isinstance(kind, str) else ""

    filter_entries = p.entries("filters")
    built_filters = [_plugin(e, at, FILTERS, Filter, ctx, p.errors) for at, e in filter_entries]
    scorer_entries = p.entries("scorers")
    built_scorers = [
        _plugin(e, at, SCORERS, Scorer, ctx, p.errors, weighted=True) for at, e in scorer_entries
    ]
    raw_picker = p.raw_value("picker") or "max-score"
    picker = _plugin(raw_picker, join(p.path, "picker"), PICKERS, Picker, ctx, p.errors)
    sampling = read_sampling(p, ctx.failover)
    p.done()
    kept_filters = [
        (type_of(e), f[0]) for (_, e), f in zip(filter_entries, built_filters, strict=True) if f
    ]
    kept_scorers = [
        (type_of(e), s) for (_, e), s in zip(scorer_entries, built_scorers, strict=True) if s
    ]
    return PipelinePolicy(
        name,
        "pipeline",
        filters=tuple(f for _, f in kept_filters),
        scorers=tuple(s for _, s in kept_scorers),
        picker=picker[0] if picker else pickers.MaxScorePicker(),
        observer=ctx.observer,
        filter_types=tuple(t for t, _ in kept_filters),
        scorer_types=tuple(t for t, _ in kept_scorers),
        picker_type=type_of(raw_picker),
        sampling=sampling,
        rng=random.Random(name),
    )


POLICY_TYPES: Mapping[str, PolicyFactory] = MappingProxyType(
    {
        "class-split": _class_split,
        "round-robin": _round_robin,
        "least-outstanding": _least_outstanding,
        "cache-aware": _cache_aware,
        "pinned": _pinned,
        "pipeline": _pipeline,
        "adaptive": adaptive.make_adaptive,
        "pd": lambda name, p, ctx: pd.make_pd(name, p, ctx, _pipeline),
    }
)


def policy_types() -> tuple[str, ...]:
    """The built-in policy type names."""
    return tuple(POLICY_TYPES)


def build_policy(
    name: str,
    type: str,
    params: Mapping[str, object],
    backends: Sequence[BackendInfo],
    *,
    observer: PipelineObserver | None = None,
    failover: int | None = None,
) -> Policy:
    """Validate one policy entry and build it; raises PolicyConfigError with ALL errors.

    Paths in the errors are relative to the policy entry (``type``, ``params.by``,
    ``params.scorers[1].type``, ...). Built-in policies report their plugins' run times
    and emptied candidate sets to ``observer`` (the router's metrics), if given.
    ``failover``: the router's ``failover.max_attempts``, as long as a sampled ranking gets.
    """
    errors: Errors = []
    ctx = BuildContext(tuple(backends), NullObserver() if observer is None else observer, failover)
    p = Reader.of(params, "params", errors)
    policy: Policy | None = None
    if type in POLICY_TYPES:
        policy = POLICY_TYPES[type](name, p, ctx)
    elif ":" in type:
        policy = _external_policy(name, type, p.raw, ctx, errors)
    else:
        errors.append(("type", unknown(type, POLICY_TYPES, "policy type")))
    if errors or policy is None:  # every way to None records an error: never an empty list
        raise PolicyConfigError(errors)
    return policy


def _external_policy(
    name: str, ref: str, params: Mapping[str, object], ctx: BuildContext, errors: Errors
) -> Policy | None:
    factory = _load_external(ref, "type", errors)
    if factory is None:
        return None
    try:
        built = factory(name, dict(params), ctx.backends)
    except (ValueError, TypeError) as exc:  # bad params, or a factory of the wrong shape
        errors.append(("params", str(exc)))
        return None
    if not isinstance(built, Policy):
        errors.append(("type", f"{ref!r} did not return a Policy"))
        return None
    return built
