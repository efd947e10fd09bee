"""Cache-aware routing: send a request where its prompt's prefix is probably still cached.

Engines keep the KV of prompts they have seen (vLLM's automatic prefix caching); a request
whose leading blocks a replica already holds skips most of its prefill there. The router has
no engine tokenizer and no view into the engines' caches, so it keeps its own record of what
it sent where: the prompt text is cut into fixed-size character blocks named by a hash chain
(:func:`prompt_blocks`: a block's hash covers its parent's, so equal hashes mean equal
prefixes), and each backend keeps the hashes of the prompts routed to it in a bounded LRU
(:class:`PrefixIndex`), aged out like an engine's cache: least recently routed first, a
prompt's tail before its head.

The ``cache-aware`` policy keeps a request on its cache-warm backend until that backend is
saturated, where saturated means its queue costs more than a miss elsewhere: each backend is
priced at the prefill tokens waiting there (the router's open prompts, scaled by the share of
recently routed prompt tokens that missed the index there) plus the request's own tokens it
probably does not hold, each at :data:`MISS_WEIGHT` (:func:`prefill_cost`). The request then
spreads to the cheapest backend, which then holds the prefix too, so a hot prefix ends up
replicated where there is room. The pipeline scorer and ``adaptive`` gate by in-flight
counts instead (:meth:`PrefixIndex.open`).
"""

from __future__ import annotations

import random
import zlib
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Filter, Scorer
from policies.candidates import healthy
from policies.params import BuildContext
from policies.pipeline import NO_HEALTHY
from policies.sampling import Sampling, draw
from policies.types import Candidate, Decision, Outcome, RequestInfo, group_of
from turnout.common.schema import Reader

BLOCK_CHARS = 256
"""Characters per block: about 50 tokens of English text, a few engine blocks."""
MAX_BLOCKS = 4096
"""Blocks hashed per prompt (a million characters); longer prompts share on their head."""
DEFAULT_CAPACITY = 32768
"""Blocks remembered per backend until its engine says how much KV it has (or when it never
does): about 8 MB of prompt text, over 10^6 tokens. A router that forgets before the engine
does sends a prompt away from its cache: half this left the public Mooncake sample's hit
rate at 0.78 of the oracle's on 10^6-token replicas, this 0.97."""
DEFAULT_IMBALANCE = 4
HOLDERS = 4
"""Backends remembered per block as its latest holders (:meth:`PrefixIndex.nominate`)."""
MISS_WEIGHT = 4.0
"""Prefill tokens waited for that one prompt token a backend lacks is worth. More than its own
prefill (1): while the engine's cache is full it evicts a cached token that a later request
then misses (1), and it delays every request that later queues behind it there, by about
1 / (1 - utilization) of it on a busy pool (2 at half load). A sweep of the weight in the
simulator is in docs/benchmarks.md (Prefix routing)."""
RECALL = 2.0
"""The record holds this many times the blocks its engine's KV cache holds. It cannot see the
engine's evictions, and its two errors cost differently: forgetting a prefix the engine still
holds sends the request away from it (a miss, and one more copy crowding another cache),
while remembering one the engine dropped costs a miss the request would have had anyway. On
the public Mooncake sample at its own rate, in `replay simulate`: 1x hit 34.6% of prompt
tokens, 1.5x 40.9%, 2x 42.3%, 3x 42.1% on 10^6-token replicas; 55.1% from 1.5x up on
4 x 10^6 (an unbounded cache: 55.5%)."""
UNCACHED_SMOOTHING = 0.1
"""Weight of the latest routed prompt in a backend's moving uncached share (about the last
ten: the order of a queue's length under load)."""


def prompt_blocks(text: str, size: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The hash chain of ``text``'s full ``size``-character blocks (a partial tail is left
    out, as an engine caches only full blocks): block ``i``'s is ``i`` above the CRC-32 of
    the text up to its end.

    The same in every process: the router's workers and replicas pass their placements to
    one another (router.control.placement), so a chain must not depend on a per-process
    salt, as Python's string hash does. A false match costs one misrouted prompt, never a
    wrong answer, so CRC-32 at a given depth is enough, and it runs at memory speed.
    """
    out: list[int] = []
    crc = 0
    end = min(len(text), size * MAX_BLOCKS) - size
    if text.isascii():  # one encoding, sliced without copies
        data = memoryview(text.encode("ascii"))
        for i, start in enumerate(range(0, end + 1, size)):
            crc = zlib.crc32(data[start : start + size], crc)
            out.append(i << 32 | crc)
    else:
        for i, start in enumerate(range(0, end + 1, size)):
            crc = zlib.crc32(text[start : start + size].encode("utf-8", "surrogatepass"), crc)
            out.append(i << 32 | crc)
    return tuple(out)


@dataclass(slots=True)
class PrefixIndex:
    """Per backend, the block hashes of the prompts routed there (a bounded LRU each)."""

    capacity: int | None = None
    """Blocks remembered per backend; None: as many as its engine's KV cache holds
    (:meth:`observe`), :data:`DEFAULT_CAPACITY` until that is known."""
    backends: Collection[str] = ()
    """The configured backend names; outcomes from any other name are ignored (a replica
    discovered behind one counts as that one's: :func:`~policies.types.group_of`)."""
    _lru: dict[str, OrderedDict[int, None]] = field(default_factory=dict)
    _uncached: dict[str, float] = field(default_factory=dict)
    """Per backend, the moving share of the prompt tokens routed there that it did not hold
    (1 until a prompt is routed there: nothing is known to be cached)."""
    _sized: dict[str, int] = field(default_factory=dict)
    """Per backend, the blocks its engine's KV cache holds (when ``capacity`` is None)."""
    _tokens: int = 0
    _blocks: int = 0
    """Prompt tokens and blocks of the prompts seen: the tokens a block stands for."""
    _holders: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Per block, the last :data:`HOLDERS` backends whose record holds it (latest last): the
    ones to read for a prompt when a policy reads only a few (:meth:`nominate`)."""

    def observe(self, req: RequestInfo, candidates: Sequence[Candidate]) -> None:
        """Size each candidate's record after its engine's cache: its KV in tokens (scraped)
        over the tokens a block of this traffic stands for (the router's own count), times
        :data:`RECALL`."""
        if self.capacity is not None:
            return
        if 0 < len(req.prefix_blocks) < MAX_BLOCKS:
            self._tokens += req.prompt_tokens
            self._blocks += len(req.prefix_blocks)
        if not self._blocks:
            return
        per_block = self._tokens / self._blocks
        for c in candidates:
            kv = c.load.kv_cache_tokens if c.load is not None else None
            if kv:
                self._sized[c.name] = max(1, int(RECALL * kv / per_block))

    def capacity_of(self, backend: str) -> int:
        """Blocks remembered for ``backend`` at most."""
        if self.capacity is not None:
            return self.capacity
        return self._sized.get(backend, DEFAULT_CAPACITY)

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

    def nominate(self, req: RequestInfo) -> list[str]:
        """The backends most likely to hold the most of ``req``'s prefix: the latest holders
        of its deepest block held anywhere, and of its first block (at most 2 x
        :data:`HOLDERS`; found in as many steps as the prefix has blocks held)."""
        blocks = req.prefix_blocks
        if not blocks:
            return []
        head = self._holders.get(blocks[0], ())
        deepest = head
        for h in blocks[1:]:
            held = self._holders.get(h)
            if not held:
                break
            deepest = held
        return list(dict.fromkeys((*reversed(deepest), *reversed(head))))

    def _unhold(self, block: int, backend: str) -> None:
        held = self._holders.get(block)
        if held is not None and backend in held:
            rest = tuple(n for n in held if n != backend)
            if rest:
                self._holders[block] = rest
            else:
                del self._holders[block]

    def forget(self, backend: str) -> None:
        """Drop ``backend``'s blocks (it left: see :class:`policies.base.Forgets`)."""
        for h in self._lru.get(backend, ()):
            self._unhold(h, backend)
        self._lru.pop(backend, None)
        self._uncached.pop(backend, None)
        self._sized.pop(backend, None)

    def routed(self, backend: str, uncached: float) -> None:
        """A prompt of which ``backend`` probably lacked the share ``uncached`` went there."""
        if group_of(backend) not in self.backends:
            return
        old = self._uncached.get(backend, 1.0)
        self._uncached[backend] = old + UNCACHED_SMOOTHING * (uncached - old)

    def queued_prefill(self, c: Candidate) -> float:
        """Prefill tokens probably waiting on ``c``: its open prompts (the router's count,
        which drops a prompt at its first token) times the share of recently routed prompt
        tokens it did not hold (a warm backend's queue is mostly cache hits)."""
        return c.outstanding_prompt_tokens * self._uncached.get(c.name, 1.0)

    def record(self, backend: str, blocks: Sequence[int]) -> None:
        """``backend`` now holds ``blocks``: they become its most recently used, the head
        last, so the head is evicted last (a shared head outlives each prompt's tail)."""
        if not blocks or group_of(backend) not in self.backends:
            return
        lru = self._lru.setdefault(backend, OrderedDict())
        holders = self._holders
        for h in reversed(blocks):
            lru[h] = None
            lru.move_to_end(h)
            held = holders.get(h, ())
            if not held or held[-1] != backend:
                holders[h] = (*(n for n in held[-HOLDERS:] if n != backend), backend)[-HOLDERS:]
        capacity = self.capacity_of(backend)
        while len(lru) > capacity:
            self._unhold(lru.popitem(last=False)[0], backend)

    def open(self, candidates: Sequence[Candidate], max_imbalance: int | None) -> list[Candidate]:
        """The candidates the load gate lets a warm request stick to: not at their
        ``max_inflight``, nor ``max_imbalance`` (when set) busier than the least busy."""
        if not candidates:
            return []
        low = min(c.inflight for c in candidates)
        cap = float("inf") if max_imbalance is None else low + max_imbalance
        return [c for c in candidates if not c.saturated and c.inflight < cap]

    def warmest(
        self, req: RequestInfo, candidates: Sequence[Candidate], max_imbalance: int
    ) -> Candidate | None:
        """The open candidate holding the most of ``req``'s leading blocks (ties: least
        loaded), or None when no open candidate holds any."""
        best: Candidate | None = None
        if not req.prefix_blocks:
            return best  # a prompt shorter than a block is held nowhere: no gate to price
        best_key = (0, 0, 0)
        for c in self.open(candidates, max_imbalance):
            n = self.matched(c.name, req.prefix_blocks)
            key = (n, -c.inflight, -c.outstanding_tokens)
            if n and (best is None or key > best_key):
                best, best_key = c, key
        return best


def read_index(
    p: Reader, ctx: BuildContext, imbalance: int | None
) -> tuple[PrefixIndex, int | None]:
    """The shared params: ``capacity_blocks`` (per backend; default: what its engine's KV
    cache holds) and ``max_imbalance`` (default ``imbalance``)."""
    capacity = p.integer("capacity_blocks", None, low=1)
    limit = p.integer("max_imbalance", imbalance, low=1)
    return PrefixIndex(capacity, frozenset(b.name for b in ctx.backends)), limit


@dataclass(frozen=True, slots=True)
class CacheAwareScorer:
    """The share of the prompt's leading blocks each backend probably holds, in [0, 1];
    0 for a backend the load gate closes. A learner: it sizes its record when a request is
    sent, and records where requests were served (so it learns of a placement when the
    request finishes)."""

    reads_prefix: ClassVar[bool] = True
    shares_placement: ClassVar[bool] = True

    index: PrefixIndex
    max_imbalance: int | None = DEFAULT_IMBALANCE

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        scores = dict.fromkeys((c.name for c in candidates), 0.0)
        total = len(req.prefix_blocks)
        if total:
            for c in self.index.open(candidates, self.max_imbalance):
                scores[c.name] = self.index.matched(c.name, req.prefix_blocks) / total
        return scores

    def committed(self, req: RequestInfo, candidates: Sequence[Candidate], backend: str) -> None:
        self.index.observe(req, candidates)

    def nominate(self, req: RequestInfo) -> list[str]:
        return self.index.nominate(req)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        if outcome.ok:
            self.index.record(backend, req.prefix_blocks)

    def learn(self, backend: str, blocks: Sequence[int]) -> None:
        """Another router process sent a prompt of ``blocks`` to ``backend``."""
        self.index.record(backend, blocks)

    def forget(self, backend: str) -> None:
        self.index.forget(backend)


def make_cache_aware(p: Reader, ctx: BuildContext) -> Scorer:
    """``cache-aware``: ``capacity_blocks`` (default: the engine's KV), ``max_imbalance``
    (default 4)."""
    index, imbalance = read_index(p, ctx, DEFAULT_IMBALANCE)
    p.done()
    return CacheAwareScorer(index, imbalance)


def prefill_cost(index: PrefixIndex, req: RequestInfo, c: Candidate, matched: int) -> float:
    """The price of sending ``req`` to ``c``, in prefill tokens: those queued there, plus its
    own that ``c`` probably lacks (``matched`` of its blocks held) at :data:`MISS_WEIGHT`
    each. Backends of one pool prefill at one rate, so tokens compare as seconds would."""
    total = len(req.prefix_blocks)
    missed = req.prompt_tokens * (1 - matched / total) if total else float(req.prompt_tokens)
    return index.queued_prefill(c) + MISS_WEIGHT * missed


@dataclass(slots=True)
class CacheAwarePolicy:
    """``cache-aware``: the backend where the request's prefill finishes soonest by
    :func:`prefill_cost` (a warm backend until its queue costs more than a miss elsewhere),
    ties to the less loaded; saturated backends (at ``max_inflight``, or ``max_imbalance``
    requests busier than the least busy candidate when that is set) last. It records its pick
    at once (a burst of requests with one prefix then sticks together) and the serving
    backend when the request finishes.

    ``Decision.scores`` holds each backend's share of the prompt's blocks it probably holds.
    """

    reads_prefix: ClassVar[bool] = True
    shares_placement: ClassVar[bool] = True

    name: str
    index: PrefixIndex
    max_imbalance: int | None = None
    filters: tuple[Filter, ...] = ()
    """The backends the request may use (the ``backends`` param), applied in order."""
    type: str = "cache-aware"
    sampling: Sampling = field(default_factory=lambda: Sampling(None))
    """Above how many candidates to read only a sample and the prompt's warm backends."""
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        pool = healthy(candidates)
        for flt in self.filters:
            pool = flt.filter(req, pool)
        if not pool:
            return Decision((), empty_reason=NO_HEALTHY)
        drawn = None
        if self.sampling.applies(len(pool)):
            drawn = draw(pool, self.sampling, self.rng, self.index.nominate(req))
            pool = drawn.scored
        blocks = req.prefix_blocks
        matched = {c.name: self.index.matched(c.name, blocks) for c in pool}
        opened = {c.name for c in self.index.open(pool, self.max_imbalance)}
        ranked = sorted(
            pool,
            key=lambda c: (
                c.name not in opened,
                prefill_cost(self.index, req, c, matched[c.name]),
                c.inflight,
                c.outstanding_tokens,
                self.index.size(c.name),  # a cold prompt goes where the least is cached
            ),
        )
        total = len(blocks) or 1
        names = [c.name for c in ranked]
        return Decision(
            drawn.ranking(names) if drawn is not None else tuple(names),
            scores={n: m / total for n, m in matched.items()},
            memo=pool,
        )

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        """Record the pick at once: a burst of requests with one prefix then sticks
        together (``Decision.scores`` is the share of the prompt ``backend`` held)."""
        pool = decision.memo
        if isinstance(pool, Sequence):
            self.index.observe(req, pool)
        self.index.routed(
            backend, 1 - decision.scores.get(backend, 0.0) if req.prefix_blocks else 1.0
        )
        self.index.record(backend, req.prefix_blocks)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        if outcome.ok:
            self.index.record(backend, req.prefix_blocks)

    def learn(self, backend: str, blocks: Sequence[int]) -> None:
        """Another router process sent a prompt of ``blocks`` to ``backend``."""
        self.index.record(backend, blocks)

    def forget(self, backend: str) -> None:
        self.index.forget(backend)
