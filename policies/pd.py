"""``pd``: disaggregated prefill and decode, a prefill pool and a decode pool.

The router serves a request in two hops (router/proxy/pd.py): a prefill engine computes the
prompt's KV and holds it, then a decode engine pulls it and streams the answer. This policy
only ranks, purely: :meth:`PdPolicy.plan` gives both pools' rankings, each chosen by its own
pipeline of the usual plugins (by default prefix-aware for prefill: ``cache-aware`` with
``least-tokens``; load- and KV-aware for decode: ``least-requests`` with ``kv-cache``), the
co-located ``fallback`` backends for when every prefill fails, and whether to skip the
prefill hop: when the decode engine ranked first probably holds more than
``skip_prefill_above`` of the prompt already (the share of its leading blocks recorded where
decodes were served; vllm-router's ``pd_uncached_token_threshold`` and llm-d's decider do
likewise), it prefills the rest itself.

Params::

    {type: pd, params: {prefill: [p0, p1], decode: [d0, d1], fallback: [c0],
                        skip_prefill_above: 0.8, prefill_pipeline: {scorers: [...]},
                        decode_pipeline: {filters: [...], scorers: [...], picker: ...}}}

``prefill``, ``decode`` and ``fallback`` list backend names or engine kinds; a pool's
pipeline gets a ``members`` filter of its backends first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.filters import MembersFilter
from policies.params import BuildContext
from policies.pipeline import PipelinePolicy
from policies.prefix import PrefixIndex
from policies.types import Candidate, Decision, Outcome, RequestInfo, group_of
from turnout.common.schema import Reader, join

PipelineBuilder = Callable[[str, Reader, BuildContext], object]
DEFAULT_SKIP = 0.8
PREFILL_PIPELINE = {"scorers": [{"type": "cache-aware"}, {"type": "least-tokens", "weight": 0.5}]}
DECODE_PIPELINE = {"scorers": [{"type": "least-requests"}, {"type": "kv-cache"}]}


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """Both hops' decisions for one request (heads serve, tails are each hop's failover);
    what :meth:`PdPolicy.choose` puts in its decision's ``memo``."""

    decode: Decision
    prefill: Decision | None = None
    """None when the prefill hop is skipped."""
    fallback: Decision | None = None
    """Co-located backends for the whole request when every prefill fails."""

    @property
    def skipped(self) -> bool:
        """The decode engine first ranked holds enough of the prompt: no prefill hop."""
        return self.prefill is None

    @property
    def fallback_ranked(self) -> tuple[str, ...]:
        return self.fallback.ranked if self.fallback is not None else ()


@dataclass(slots=True)
class PdPolicy:
    """See the module. ``choose`` ranks the decode pool (the one hop of a shadow, or of a
    skipped prefill) and keeps the whole :class:`PhasePlan` in the decision's ``memo``."""

    name: str
    prefill: PipelinePolicy
    decode: PipelinePolicy
    fallback: PipelinePolicy | None
    index: PrefixIndex
    """Where decodes were served: what each decode engine probably caches."""
    skip_above: float | None
    fallback_names: frozenset[str] = frozenset()
    prefill_names: frozenset[str] = frozenset()
    type: str = "pd"
    shares_placement: ClassVar[bool] = True
    """Its record of where decodes went decides the skip, and the prefill pool's pipeline
    (``cache-aware`` by default) keeps one of its own: both learn from every process of the
    router (:meth:`learn`)."""

    def plan(self, req: RequestInfo, candidates: Sequence[Candidate]) -> PhasePlan:
        """Rank both pools (and the fallback) for ``req``. Pure."""
        decode = self.decode.choose(req, candidates)
        fallback = self.fallback.choose(req, candidates) if self.fallback else None
        blocks = req.prefix_blocks
        if decode.ranked and self.skip_above is not None and blocks:
            share = self.index.matched(decode.ranked[0], blocks) / len(blocks)
            if share > self.skip_above:
                return PhasePlan(decode, None, fallback)
        return PhasePlan(decode, self.prefill.choose(req, candidates), fallback)

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        phases = self.plan(req, candidates)
        decode = phases.decode
        return Decision(decode.ranked, empty_reason=decode.empty_reason, memo=phases)

    def prefill_committed(self, req: RequestInfo, phases: PhasePlan, backend: str) -> None:
        """The prefill hop goes to ``backend``: its pipeline's plugins record it."""
        if phases.prefill is not None:
            self.prefill.committed(req, phases.prefill, backend)

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        """The request's answer goes to ``backend`` (a decode engine, or a fallback)."""
        phases = decision.memo
        if not isinstance(phases, PhasePlan):
            return
        if self.fallback is not None and phases.fallback is not None and self._fallback(backend):
            self.fallback.committed(req, phases.fallback, backend)
        else:
            self.decode.committed(req, phases.decode, backend)
            survivors = phases.decode.memo  # the decode candidates: size the index by them
            if isinstance(survivors, Sequence):
                self.index.observe(req, survivors)

    def prefilled(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """A prefill hop ended on ``backend``: its pipeline's learners hear of it."""
        self.prefill.on_finish(req, backend, outcome)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """The request ended on ``backend`` (its decode engine, or a fallback)."""
        if self.fallback is not None and self._fallback(backend):
            self.fallback.on_finish(req, backend, outcome)
            return
        self.decode.on_finish(req, backend, outcome)
        if outcome.ok:
            self.index.record(backend, req.prefix_blocks)

    def learn(self, backend: str, blocks: Sequence[int]) -> None:
        """Another router process sent a prompt of ``blocks`` to ``backend``: a hop of its
        pool, the prefill pool's first, then the fallback's, then the decode pool's (a
        backend listed in two pools learns as the first)."""
        group = group_of(backend)
        if group in self.prefill_names:
            self.prefill.learn(backend, blocks)
        elif self.fallback is not None and group in self.fallback_names:
            self.fallback.learn(backend, blocks)
        else:
            self.index.record(backend, blocks)  # ignores a backend not of the decode pool
            self.decode.learn(backend, blocks)

    def _fallback(self, backend: str) -> bool:
        return group_of(backend) in self.fallback_names

    def forget(self, backend: str) -> None:
        self.index.forget(backend)
        for pool in (self.prefill, self.decode, self.fallback):
            if pool is not None:
                pool.forget(backend)


def _pool(
    name: str,
    p: Reader,
    ctx: BuildContext,
    key: str,
    default: Mapping[str, object],
    build: PipelineBuilder,
    required: bool = True,
) -> tuple[PipelinePolicy | None, frozenset[str]]:
    """The pipeline of pool ``key``: its ``KEY_pipeline`` (or ``default``) behind a
    ``members`` filter of the backends ``key`` lists."""
    entries = p.string_list(key, required=required, non_empty=True)
    raw = p.raw_value(f"{key}_pipeline")
    if entries is None:
        return None, frozenset()
    names = frozenset(n for tier in ctx.resolve(p, key, entries) for n in tier)
    reader = Reader.of(default if raw is None else raw, join(p.path, f"{key}_pipeline"), p.errors)
    built = build(f"{name}/{key}", reader, ctx)
    if not isinstance(built, PipelinePolicy):
        return None, names
    pipeline = dataclasses.replace(
        built,
        name=name,
        type="pd",
        filters=(MembersFilter(names), *built.filters),
        filter_types=("members", *built.filter_types),
    )
    return pipeline, names


def make_pd(name: str, p: Reader, ctx: BuildContext, build: PipelineBuilder) -> PdPolicy:
    """``pd`` from its params; ``build`` is the registry's pipeline builder."""
    prefill, p_names = _pool(name, p, ctx, "prefill", PREFILL_PIPELINE, build)
    decode, d_names = _pool(name, p, ctx, "decode", DECODE_PIPELINE, build)
    fallback, f_names = _pool(name, p, ctx, "fallback", DECODE_PIPELINE, build, required=False)
    off = p.has("skip_prefill_above") and p.raw["skip_prefill_above"] is None
    skip = None if off else p.number("skip_prefill_above", DEFAULT_SKIP, low=0.0, high=1.0)
    both = p_names & d_names
    if both:
        p.error("decode", f"{', '.join(sorted(both))} also listed under prefill")
    p.done()
    if prefill is None or decode is None:  # an error was recorded: the build fails
        prefill = decode = PipelinePolicy(name, "pd")
    index = PrefixIndex(None, d_names)
    return PdPolicy(name, prefill, decode, fallback, index, skip, f_names, p_names)
