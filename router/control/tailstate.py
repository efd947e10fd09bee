"""What the tail defences remember between requests (one per router app, per worker): the
hedge budget of each class, and each backend's recent TTFTs per class for ``auto`` deadlines
and ``after: pNN`` hedge delays.

The budget is a token bucket: each streamed request of the class adds ``max_fraction`` of a
hedge (up to :data:`BURST_REQUESTS` requests' worth), each hedge spends one, so over any
stretch hedges stay within ``max_fraction`` of the requests. While the pool is queueing the
bucket is emptied: when every backend is busy a copy only adds to a queue, and the budget
then has to refill from zero.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from router.config.tail import TailSettings

BURST_REQUESTS = 100
"""The bucket holds at most the hedges this many requests earn (at least one)."""
WINDOW = 256
"""TTFTs kept per class and backend."""
MIN_SAMPLES = 20
"""Before this many, ``auto`` uses its ceiling and ``pNN`` hedges do not fire."""
_RESORT = 16  # quantiles are recomputed after this many new samples, not per request


@dataclass(slots=True)
class HedgeBudget:
    fraction: float
    tokens: float = 0.0

    def earn(self) -> None:
        """A request of the class went out."""
        cap = max(1.0, self.fraction * BURST_REQUESTS)
        self.tokens = min(cap, self.tokens + self.fraction)

    def spend(self, queueing: bool) -> bool:
        """Whether a hedge may go now (and if so, count it)."""
        if queueing:
            self.tokens = 0.0
            return False
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(slots=True)
class TtftWindow:
    """The last :data:`WINDOW` TTFTs of one class on one backend."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _sorted: list[float] = field(default_factory=list)
    _fresh: int = 0

    def add(self, ttft: float) -> None:
        self.samples.append(ttft)
        self._fresh += 1

    def quantile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100); None while fewer than :data:`MIN_SAMPLES`."""
        if len(self.samples) < MIN_SAMPLES:
            return None
        if self._fresh >= _RESORT or not self._sorted:
            self._sorted, self._fresh = sorted(self.samples), 0
        s = self._sorted
        return s[min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1)]


@dataclass(slots=True)
class TailMemory:
    """The budgets and TTFT windows of every class with ``tail`` settings."""

    budgets: dict[str, HedgeBudget] = field(default_factory=dict)
    ttfts: dict[tuple[str, str], TtftWindow] = field(default_factory=dict)

    def budget(self, cls: str, fraction: float) -> HedgeBudget:
        b = self.budgets.get(cls)
        if b is None or b.fraction != fraction:  # a reload changed it: start afresh
            b = self.budgets[cls] = HedgeBudget(fraction)
        return b

    def window(self, cls: str, backend: str) -> TtftWindow:
        w = self.ttfts.get((cls, backend))
        if w is None:
            w = self.ttfts[(cls, backend)] = TtftWindow()
        return w

    def deadline(self, tail: TailSettings, cls: str, backend: str) -> float | None:
        """Seconds an attempt on ``backend`` may take to its first content (None: no bound)."""
        if not tail.auto:
            return tail.first_token_timeout
        p99 = self.window(cls, backend).quantile(99)
        if p99 is None:
            return tail.auto_max
        return min(tail.auto_max, max(tail.auto_min, tail.auto_multiple * p99))

    def hedge_delay(self, tail: TailSettings, cls: str, backend: str) -> float | None:
        """Seconds without a first content before a copy goes (None: no hedge)."""
        hedge = tail.hedge
        if hedge is None:
            return None
        if hedge.after_quantile is None:
            return hedge.after
        return self.window(cls, backend).quantile(hedge.after_quantile)
