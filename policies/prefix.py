"""Cache-aware routing: send a request where its prompt's prefix is probably still cached.

Engines keep the KV of prompts they have seen (vLLM's automatic prefix caching); a request
whose leading blocks a replica already holds skips most of its prefill there. The router has
no engine tokenizer and no view into the engines' caches, so it keeps its own record of what
it sent where: the prompt text is cut into fixed-size character blocks named by a hash chain
(:func:`prompt_blocks`: a block's hash covers its parent's, so equal hashes mean equal
prefixes), and each backend keeps the hashes of the prompts routed to it in a bounded LRU
(:class:`PrefixIndex`), aged out like an engine's cache: least recently routed first, a
prompt's tail before its head.

The load gate keeps a request on its cache-warm backend until that backend is saturated
(at its ``max_inflight``, or ``max_imbalance`` requests busier than the least busy
candidate), then spreads: the request goes to the least loaded backend, which then holds the
prefix too, so a hot prefix ends up replicated where there is room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from common.schema import Reader
from policies.base import Filter, Scorer
from policies.params import BuildContext
from policies.pipeline import NO_HEALTHY
from policies.types import Candidate, Decision, Outcome, RequestInfo, group_of

BLOCK_CHARS = 256
"""Characters per block: about 50 tokens of English text, a few engine blocks."""
MAX_BLOCKS = 4096
"""Blocks hashed per prompt (a million characters); longer prompts share on their head."""
DEFAULT_CAPACITY = 32768
"""Blocks remembered per backend: about 8 MB of prompt text, over 10^6 tokens (a router that
forgets before the engine does sends a prompt away from its cache: half this left the public
Mooncake sample's hit rate at 0.78 of the oracle's on 10^6-token replicas, this 0.97)."""
DEFAULT_IMBALANCE = 4


def prompt_blocks(text: str, size: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The hash chain of ``text``'s full ``size``-character blocks (a partial tail is left
    out, as an engine caches only full blocks).

    Python's string hash is salted per process; every prompt a policy sees is hashed in the
    router process that holds the policy, so the chain is consistent where it is used.
    """
    out: list[int] = []
    parent = 0
    end = min(len(text), size * MAX_BLOCKS) - size
    for start in range(0, end + 1, size):
        parent = hash((parent, text[start : start + size]))
        out.append(parent)
    return tuple(out)


@dataclass(slots=True)
class PrefixIndex:
    """Per backend, the block hashes of the prompts routed there (a bounded LRU each)."""

    capacity: int = DEFAULT_CAPACITY
    backends: Collection[str] = ()
    """The configured backend names; outcomes from any other name are ignored (a replica
    discovered behind one counts as that one's: :func:`~policies.types.group_of`)."""
    _lru: dict[str, OrderedDict[int, None]] = field(default_factory=dict)

    def matched(self, backend: str, blocks: Sequence[int]) -> int:
        """How many of ``blocks``' leading blocks ``backend`` probably holds."""
        lru = self._lru.get(backend)
        if not lru:
            return 0
        n = 0
        for h in blocks:
            if h not in lru:
                break
            n += 1
        return n

    def size(self, backend: str) -> int:
        """Blocks remembered for ``backend``."""
        return len(self._lru.get(backend, ()))

    def forget(self, backend: str) -> None:
        """Drop ``backend``'s blocks (it left: see :class:`policies.base.Forgets`)."""
        self._lru.pop(backend, None)

    def record(self, backend: str, blocks: Sequence[int]) -> None:
        """``backend`` now holds ``blocks``: they become its most recently used, the head
        last, so the head is evicted last (a shared head outlives each prompt's tail)."""
        if not blocks or group_of(backend) not in self.backends:
            return
        lru = self._lru.setdefault(backend, OrderedDict())
        for h in reversed(blocks):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def open(self, candidates: Sequence[Candidate], max_imbalance: int) -> list[Candidate]:
        """The candidates the load gate lets a warm request stick to."""
        if not candidates:
            return []
        low = min(c.inflight for c in candidates)
        return [c for c in candidates if not c.saturated and c.inflight < low + max_imbalance]

    def warmest(
        self, req: RequestInfo, candidates: Sequence[Candidate], max_imbalance: int
    ) -> Candidate | None:
        """The open candidate holding the most of ``req``'s leading blocks (ties: least
        loaded), or None when no open candidate holds any."""
        best: Candidate | None = None
        best_key = (0, 0, 0)
        for c in self.open(candidates, max_imbalance):
            n = self.matched(c.name, req.prefix_blocks)
            key = (n, -c.inflight, -c.outstanding_tokens)
            if n and (best is None or key > best_key):
                best, best_key = c, key
        return best


def read_index(p: Reader, ctx: BuildContext) -> tuple[PrefixIndex, int]:
    """The shared params: ``capacity_blocks`` (per backend) and ``max_imbalance``."""
    capacity = p.integer("capacity_blocks", DEFAULT_CAPACITY, low=1)
    imbalance = p.integer("max_imbalance", DEFAULT_IMBALANCE, low=1)
    return PrefixIndex(capacity, frozenset(b.name for b in ctx.backends)), imbalance


@dataclass(frozen=True, slots=True)
class CacheAwareScorer:
    """The share of the prompt's leading blocks each backend probably holds, in [0, 1];
    0 for a backend the load gate closes. A learner: it records where requests were served
    (so it learns of a placement when the request finishes)."""

    index: PrefixIndex
    max_imbalance: int = DEFAULT_IMBALANCE

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        scores = dict.fromkeys((c.name for c in candidates), 0.0)
        total = len(req.prefix_blocks)
        if total:
            for c in self.index.open(candidates, self.max_imbalance):
                scores[c.name] = self.index.matched(c.name, req.prefix_blocks) / total
        return scores

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        if outcome.ok:
            self.index.record(backend, req.prefix_blocks)

    def forget(self, backend: str) -> None:
        self.index.forget(backend)


def make_cache_aware(p: Reader, ctx: BuildContext) -> Scorer:
    """``cache-aware``: ``capacity_blocks`` (default 32768), ``max_imbalance`` (default 4)."""
    index, imbalance = read_index(p, ctx)
    p.done()
    return CacheAwareScorer(index, imbalance)


@dataclass(slots=True)
class CacheAwarePolicy:
    """``cache-aware``: the open backend holding most of the prompt's head, else the least
    loaded; saturated backends last. It records its pick at once (a burst of requests with
    one prefix then sticks together) and the serving backend when the request finishes.

    ``Decision.scores`` holds each backend's share of the prompt's blocks it probably holds.
    """

    name: str
    index: PrefixIndex
    max_imbalance: int = DEFAULT_IMBALANCE
    filters: tuple[Filter, ...] = ()
    """The backends the request may use (the ``backends`` param), applied in order."""
    type: str = "cache-aware"

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        pool: Sequence[Candidate] = [c for c in candidates if c.healthy]
        for flt in self.filters:
            pool = flt.filter(req, pool)
        if not pool:
            return Decision((), empty_reason=NO_HEALTHY)
        blocks = req.prefix_blocks
        matched = {c.name: self.index.matched(c.name, blocks) for c in pool}
        opened = {c.name for c in self.index.open(pool, self.max_imbalance)}
        ranked = sorted(
            pool,
            key=lambda c: (
                c.name not in opened,
                -matched[c.name] if c.name in opened else 0,
                c.inflight,
                c.outstanding_tokens,
                self.index.size(c.name),  # a cold prompt goes where the least is cached
            ),
        )
        self.index.record(ranked[0].name, blocks)
        total = len(blocks) or 1
        return Decision(
            tuple(c.name for c in ranked), scores={n: m / total for n, m in matched.items()}
        )

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        if outcome.ok:
            self.index.record(backend, req.prefix_blocks)

    def forget(self, backend: str) -> None:
        self.index.forget(backend)
