"""A cold engine: its first prompts are prefilled a few at a time across all its ranks.

Both engines of the public run show the same shape in their TTFT tail, in units of their own
prefill time (about 1.4 s for vLLM, 2.6 s for DeepInfer at 8,192 tokens): the published mean
is about 1.5 prefills and the P95 about 6, and the P95 end-to-end latency is a P95 TTFT plus
a whole decode. Per-rank queueing cannot make that tail. Sixteen simultaneous prompts on
eight ranks wait at most two prefills each, and a load balancer only shortens the wait; a
P95 of 6 prefills with a mean of 1.5 needs a few requests that waited a very long time
while the rest did not wait at all. The opening burst is one such moment, and exactly one
in a closed loop of 16. If that first wave is prefilled two prompts at a time across the
node (waits of 1, 1, 2, 2, ... 8, 8 prefills) and every later prompt finds a rank free,
the run's mean is 1.56 prefills and its P95 is 6. That holds for both engines within a few
percent, and the P95 end-to-end latency, which nothing was fitted to, follows (vLLM: 0.98 of
published).

What serializes a cold node is not in the report. Kernels compiled on first use per shape
(DeepGEMM's JIT, used by both engines for DeepSeek's MoE) and lazily captured graphs are
the usual suspects; either makes the first prefills queue behind a node-wide lock. So it is
modelled as what it looks like: until ``cold_prefills`` prompts have been admitted, at most
``cold_concurrency`` are prefilled at once over all ranks, taken in the order the ranks
queue them (arrival, or priority then arrival), node-wide as a lock would be, and a warm
engine has no such limit. It is
deterministic: it adds a mechanism, not noise.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol


class _Prefilling(Protocol):
    key: int
    cold: bool

    @property
    def waiting(self) -> bool: ...


class ColdStart:
    """The node-wide limit on prefills of a cold engine, shared by its ranks."""

    __slots__ = ("_entries", "_left", "_limit", "_queue", "busy", "freed")

    def __init__(self, prefills: int, concurrency: int) -> None:
        self._left = prefills  # admissions still under the limit
        self._limit = concurrency
        # Heap of who goes next: (order, entry number, sequence); the number breaks the tie of
        # a sequence queued again (preempted) before its old entry was dropped.
        self._queue: list[tuple[tuple[int, int], int, _Prefilling]] = []
        self._entries = itertools.count()
        self.busy = 0  # cold prompts being prefilled
        self.freed = False
        """A place came free or the line moved since the engine last looked: ranks held back
        may go on."""

    def queued(self, seq: _Prefilling, order: tuple[int, int]) -> None:
        """``seq`` waits on a rank that orders it by ``order`` (priority, arrival); while the
        engine is cold it is in line for a place by the same order, so the first in line is
        always the head of its rank's queue."""
        if self._left > 0:
            heapq.heappush(self._queue, (order, next(self._entries), seq))

    def admits(self, seq: _Prefilling) -> bool:
        """Whether a rank may start prefilling ``seq`` now: a warm engine always lets it;
        a cold one when a place is free and ``seq`` is the first in line."""
        if self._left <= 0:
            return True
        queue = self._queue
        while queue and not queue[0][2].waiting:  # admitted or cancelled since
            heapq.heappop(queue)
        return self.busy < self._limit and bool(queue) and queue[0][2] is seq

    def began(self, seq: _Prefilling) -> None:
        """``seq`` was admitted to be prefilled (counted while the engine is cold)."""
        if self._left > 0:
            self._left -= 1
            self.busy += 1
            seq.cold = True
            if not self._left:
                self._queue.clear()  # warm from now on

    def left_line(self) -> None:
        """A waiting prompt was cancelled: the next in line may be on another rank."""
        if self._left > 0:
            self.freed = True

    def ended(self, seq: _Prefilling) -> None:
        """``seq``'s prefill ended (computed, preempted or cancelled)."""
        if seq.cold:
            seq.cold = False
            self.busy -= 1
            self.freed = True
