"""A latency column in bounded memory: exact up to a cap, then a log-bucketed histogram.

Percentiles interpolate linearly between order statistics, as numpy's default (which vLLM's
benchmark uses) does. Up to ``EXACT_CAP`` values the column keeps every value (8 bytes each)
and its percentiles are exact. Past the cap it folds them into buckets 0.1% wide on a log
scale, so a 100,000-request replay holds the same memory as a 20,000-request one; order
statistics are then read to within 0.1% (the mean stays exact: it comes from the sum).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable, Iterable

EXACT_CAP = 20_000
_FLOOR = 1e-6  # seconds; smaller values (and clock jitter below zero) share the first bucket
_GROWTH = 1.001
_SCALE = 1.0 / math.log(_GROWTH)


def _bucket(v: float) -> int:
    return 0 if v <= _FLOOR else int(math.log(v / _FLOOR) * _SCALE) + 1


def _value(k: int) -> float:
    """A bucket's representative value (its geometric middle)."""
    return _FLOOR if k == 0 else _FLOOR * _GROWTH ** (k - 0.5)


class Column:
    """Values of one latency (seconds); see the module doc for the memory bound."""

    __slots__ = ("_buckets", "_exact", "count", "max", "min", "total")

    def __init__(self) -> None:
        self._exact: array[float] | None = array("d")
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, v: float) -> None:
        """Account for one value."""
        self.count += 1
        self.total += v
        self.min = min(self.min, v)
        self.max = max(self.max, v)
        exact = self._exact
        if exact is not None:
            exact.append(v)
            if len(exact) > EXACT_CAP:
                for x in exact:
                    self._fold(x)
                self._exact = None
        else:
            self._fold(v)

    def extend(self, values: Iterable[float]) -> None:
        """Account for several values (as many :meth:`add` calls would, in bulk)."""
        vals = values if isinstance(values, list) else list(values)
        if not vals:
            return
        self.count += len(vals)
        for v in vals:  # one by one, so the sum is the same as add's
            self.total += v
        self.min = min(self.min, min(vals))
        self.max = max(self.max, max(vals))
        exact = self._exact
        if exact is not None:
            exact.extend(vals)
            if len(exact) <= EXACT_CAP:
                return
            vals, self._exact = list(exact), None
        buckets = self._buckets
        last, k = math.nan, 0
        for v in vals:
            if v != last:  # runs of equal values (a stream's steady gaps) share one log
                last, k = v, _bucket(v)
            buckets[k] = buckets.get(k, 0) + 1

    def _fold(self, v: float) -> None:
        k = _bucket(v)
        self._buckets[k] = self._buckets.get(k, 0) + 1

    @property
    def mean(self) -> float | None:
        """Exact mean, or None when empty."""
        return self.total / self.count if self.count else None

    def quantiles(self, qs: Iterable[float]) -> list[float | None]:
        """The ``q``-th percentiles (0..100) for each ``q``, linear interpolation."""
        ranks = self._ranked()
        out: list[float | None] = []
        for q in qs:
            if not self.count:
                out.append(None)
                continue
            pos = (self.count - 1) * q / 100.0
            lo = int(pos)
            a, b = ranks(lo), ranks(min(lo + 1, self.count - 1))
            out.append(a + (b - a) * (pos - lo))
        return out

    def _ranked(self) -> Callable[[int], float]:
        if self._exact is not None:
            return sorted(self._exact).__getitem__
        return _Ranks(sorted(self._buckets.items()), self.min, self.max, self.count)

    def spread(self, points: int) -> list[float]:
        """Up to ``points`` evenly spaced order statistics (for CDF plots)."""
        n = min(points, self.count)
        if n < 2:
            return [self.min] if n else []
        return [v or 0.0 for v in self.quantiles(100.0 * i / (n - 1) for i in range(n))]


class _Ranks:
    """The value at a rank in a bucketed column (exact at the two ends)."""

    def __init__(self, buckets: list[tuple[int, int]], lo: float, hi: float, n: int) -> None:
        self._keys = [k for k, _ in buckets]
        self._ends: list[int] = []
        total = 0
        for _, c in buckets:
            total += c
            self._ends.append(total)  # ranks [previous end, end) fall in this bucket
        self._lo, self._hi, self._n = lo, hi, n

    def __call__(self, rank: int) -> float:
        if rank <= 0:
            return self._lo
        if rank >= self._n - 1:
            return self._hi
        i = bisect.bisect_right(self._ends, rank)  # the first bucket ending after the rank
        return min(max(_value(self._keys[i]), self._lo), self._hi)
