"""One rank's KV blocks with automatic prefix caching, after vLLM's design.

A sequence's tokens are cut into ``block_size`` blocks; a full block is named by a hash
chain (its hash covers its parent's hash and its own tokens), so equal hashes mean equal
prefixes. When a sequence has computed a full block it registers the block under its hash;
later sequences whose leading blocks have the same hashes share those blocks and skip their
prefill. A block nobody holds any more stays cached but evictable: the pool hands out empty
blocks first, then evicts the least recently released cached ones. Blocks held by running
sequences are never evicted.

Accounting: ``free`` counts blocks no sequence holds (empty plus cached-evictable), so it
is the number :meth:`allocate` can hand out, and ``1 - free / total`` is vLLM's KV usage.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

_ROOT = 0  # the parent hash of a prompt's first block


def block_hashes(tokens: Sequence[int], size: int, start: list[int], upto: int) -> None:
    """Extend ``start`` (the chain's first hashes) to the first ``upto`` full blocks of
    ``tokens`` (fewer if ``tokens`` runs out)."""
    upto = min(upto, len(tokens) // size)
    parent = start[-1] if start else _ROOT
    for i in range(len(start), upto):
        # Tuples of ints hash the same in every process (only str and bytes are salted).
        parent = hash((parent, tuple(tokens[i * size : (i + 1) * size])))
        start.append(parent)


class BlockPool:
    """The KV blocks of one rank and the prefix cache over them."""

    def __init__(self, blocks: int, block_size: int) -> None:
        self.total = blocks
        self.block_size = block_size
        self.free = blocks
        self._holders: dict[int, int] = {}  # cached block hash -> sequences holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # held by none; first goes first
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of those, tokens found cached (vLLM's prefix_cache_hits)

    def cached_blocks(self) -> int:
        """Blocks holding cached content (held or evictable)."""
        return len(self._holders)

    def lookup(self, hashes: Sequence[int], limit: int) -> tuple[int, int]:
        """Leading blocks of ``hashes`` (at most ``limit``) found cached, and how many of
        those are evictable (touching them takes them out of :attr:`free`)."""
        found = evictable = 0
        holders = self._holders
        for h in hashes[:limit]:
            n = holders.get(h)
            if n is None:
                break
            found += 1
            evictable += n == 0
        return found, evictable

    def touch(self, hashes: Sequence[int]) -> None:
        """A sequence starts holding these cached blocks (found by :meth:`lookup`)."""
        for h in hashes:
            if self._holders[h] == 0:
                del self._evictable[h]
                self.free -= 1
            self._holders[h] += 1

    def allocate(self, n: int) -> None:
        """Hand out ``n`` blocks (the caller checked ``n <= free``): empty ones first, then
        the least recently released cached ones, whose content is dropped."""
        self.free -= n
        evictable = self._evictable
        while len(evictable) > self.free:
            h, _ = evictable.popitem(last=False)
            del self._holders[h]

    def register(self, h: int) -> bool:
        """Cache one of the caller's own full blocks under ``h``; False if ``h`` is already
        cached (the caller keeps its duplicate block private, as vLLM does)."""
        if h in self._holders:
            return False
        self._holders[h] = 1
        return True

    def release(self, private: int, held: Sequence[int]) -> None:
        """A sequence lets go of ``private`` uncached blocks and its cached ``held`` ones.

        Its cached blocks become evictable tail first, so a shared prefix outlives the
        sequence's own ending (vLLM frees a request's blocks in reverse order too).
        """
        self.free += private
        holders, evictable = self._holders, self._evictable
        for h in reversed(held):
            holders[h] -= 1
            if holders[h] == 0:
                evictable[h] = None
                self.free += 1
