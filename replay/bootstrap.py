"""Paired bootstrap intervals for the ratio of two runs' figures over the same requests.

Two runs of one trace answered the same requests, so their difference is measured request by
request. Each resample gives every matched request one random weight, the same in both runs
(a request slow in both stays slow in both), and computes both runs' figures over the
weighted requests; the 2.5th and 97.5th percentiles of the candidate/baseline ratios over the
resamples are the 95% interval. The weights are those of the Poisson bootstrap (Hanley and
MacGibbon, 2006): whole numbers with mean 1 and variance 1, here drawn from a 256-step table
close to Poisson(1), which stands for drawing the requests with replacement (each is drawn
a Poisson(1) number of times) and lets a resample's percentiles be read from each run's
values sorted once, without sorting a draw.

Classes are strata: their weights are drawn independently, and figures over all requests
come from the union of the classes' weighted requests (the trace fixes the class mix).
Throughput is a rate over time, not a figure of one request: its interval
(:func:`window_ratio`) weights the trace's time windows instead, each window's output tokens
against its seconds in the run.

The draws come from a generator seeded by the caller, so a report is reproducible. It is
pure Python over lists: on the order of a second per 1,000 matched requests and comparison.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RESAMPLES = 1000
LEVEL = 0.95

METRICS = (
    "mean_ttft_ms",
    "median_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p95_e2el_ms",
    "goodput",
    "success_rate",
)
"""The per-request headline figures, in the order :func:`figures` returns them."""
OVERALL = "overall"

# 256 byte values -> weights 0..5 in counts 94, 95, 46, 16, 4, 1: mean 1 and variance 1
# exactly (sum 256, sum of k*c 256, sum of k*k*c 512), each share within 0.005 of Poisson(1)'s.
_WEIGHTS = bytes(k for k, c in enumerate((94, 95, 46, 16, 4, 1)) for _ in range(c))


@dataclass(slots=True)
class Side:
    """One run's figures over one class's matched requests (index ``i``: the i-th pair).

    Latencies are in ms, NaN where the request has none (it failed; no TPOT, no gaps).
    ``good`` is whether the request met its class's SLO, None when the class has none.
    """

    ttft: list[float]
    tpot: list[float]
    itl_sum: list[float]
    itl_n: list[int]
    e2e: list[float]
    ok: list[int]
    good: list[int] | None


class _Sorted:
    """One latency of one run over a set of pairs: the values present, sorted, and which
    pair each one is (its position in the weight vector)."""

    __slots__ = ("order", "values")

    def __init__(self, present: list[tuple[float, int]]) -> None:
        present.sort()
        self.values = [v for v, _ in present]
        self.order = [i for _, i in present]

    @classmethod
    def of(cls, values: Sequence[float], offset: int) -> _Sorted:
        """The values present (not NaN) of pairs ``offset``, ``offset + 1``, ..."""
        return cls([(v, i + offset) for i, v in enumerate(values) if not math.isnan(v)])

    @classmethod
    def union(cls, parts: Sequence[_Sorted]) -> _Sorted:
        """Several sets of pairs' values as one."""
        return cls([pair for p in parts for pair in zip(p.values, p.order, strict=True)])

    def read(self, weights: Sequence[int], qs: Sequence[float]) -> tuple[float, int, list[float]]:
        """Weighted sum, weight and the ``qs`` percentiles (as numpy's over the values each
        repeated its weight's times) of the values."""
        ws = list(map(weights.__getitem__, self.order))
        total = sum(map(operator.mul, ws, self.values))
        cum = list(itertools.accumulate(ws))
        n = cum[-1] if cum else 0
        out: list[float] = []
        if not n:
            return total, 0, out
        for q in qs:
            pos = (n - 1) * q / 100.0
            lo = int(pos)
            a = self.values[bisect.bisect_right(cum, lo)]
            b = self.values[bisect.bisect_right(cum, min(lo + 1, n - 1))]
            out.append(a + (b - a) * (pos - lo))
        return total, n, out


class _Prepared:
    """One run over one class's pairs, ready for weighted figures: the pairs are positions
    ``lo`` to ``hi`` of the weight vector."""

    __slots__ = ("e2e", "good", "hi", "itl_n", "itl_sum", "lo", "tpot_at", "tpot_values", "ttft")

    def __init__(self, side: Side, lo: int) -> None:
        self.lo, self.hi = lo, lo + len(side.ok)
        self.ttft = _Sorted.of(side.ttft, lo)
        self.e2e = _Sorted.of(side.e2e, lo)
        self.tpot_at = [lo + i for i, v in enumerate(side.tpot) if not math.isnan(v)]
        self.tpot_values = [v for v in side.tpot if not math.isnan(v)]
        self.itl_sum = side.itl_sum
        self.itl_n = side.itl_n
        self.good = side.good

    def read(self, w: Sequence[int]) -> tuple[_Sums, list[float | None]]:
        """The sums of :data:`_Sums` and :data:`METRICS` under the whole weight vector."""
        ttft, ok, tq = self.ttft.read(w, (50, 95, 99) if self.ttft.values else ())
        e2e, n_e2e, eq = self.e2e.read(w, (95,) if self.e2e.values else ())
        tw = list(map(w.__getitem__, self.tpot_at))
        mine = w[self.lo : self.hi]
        good = None if self.good is None else sum(map(operator.mul, mine, self.good))
        s = (
            ttft,
            ok,
            sum(map(operator.mul, tw, self.tpot_values)),
            sum(tw),
            sum(map(operator.mul, mine, self.itl_sum)),
            sum(map(operator.mul, mine, self.itl_n)),
            e2e,
            n_e2e,
            good,
            sum(mine),
        )
        return s, _figures(s, tq, eq)


_Sums = tuple[float, int, float, int, float, int, float, int, float | None, int]
"""ttft sum and count (the successes), tpot sum and count, gap sum and count, e2e sum and
count, SLO met (None: no SLO), requests."""


def _figures(s: _Sums, ttft_q: Sequence[float], e2e_q: Sequence[float]) -> list[float | None]:
    """:data:`METRICS` from the sums and the percentiles read (none without successes)."""
    ttft_sum, ok, tpot_sum, tpot_n, gap_sum, gap_n, e2e_sum, e2e_n, good, n = s
    quants: list[float | None] = list(ttft_q) if ok else [None, None, None]
    return [
        ttft_sum / ok if ok else None,
        *quants,
        tpot_sum / tpot_n if tpot_n else None,
        gap_sum / gap_n if gap_n else None,
        e2e_sum / e2e_n if e2e_n else None,
        e2e_q[0] if e2e_n else None,
        None if good is None or not n else good / n,
        ok / n if n else None,
    ]


def _add(a: _Sums, b: _Sums) -> _Sums:
    good = None if a[8] is None or b[8] is None else a[8] + b[8]
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4],
            a[5] + b[5], a[6] + b[6], a[7] + b[7], good, a[9] + b[9])  # fmt: skip


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of sorted values, linear as numpy's default."""
    n = len(ordered)
    if not n:
        return None
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    a, b = ordered[lo], ordered[min(lo + 1, n - 1)]
    return a + (b - a) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure in both runs, their ratio (candidate / baseline) and its 95% interval."""

    baseline: float | None
    candidate: float | None
    ratio: float | None
    lo: float | None
    hi: float | None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a <= 0:
        return None
    return b / a


def _interval(ratios: list[float], resamples: int) -> tuple[float | None, float | None]:
    """The percentile interval, or none when too many resamples had no ratio (a figure
    missing from a weighted draw: too few requests of the kind)."""
    if not resamples or len(ratios) < 0.9 * resamples:
        return None, None
    ratios.sort()
    tail = (1.0 - LEVEL) / 2 * 100.0
    return quantile(ratios, tail), quantile(ratios, 100.0 - tail)


class _Run:
    """One run over every class's pairs, the classes laid end to end in one weight vector."""

    def __init__(self, sides: Sequence[Side]) -> None:
        self.classes: list[_Prepared] = []
        lo = 0
        for side in sides:
            self.classes.append(_Prepared(side, lo))
            lo += len(side.ok)
        self.size = lo
        self.ttft = _Sorted.union([p.ttft for p in self.classes])
        self.e2e = _Sorted.union([p.e2e for p in self.classes])

    def figures(self, w: Sequence[int]) -> list[list[float | None]]:
        """Per class, then over all of them: :data:`METRICS` under weights ``w``."""
        out = []
        total: _Sums | None = None
        for p in self.classes:
            s, figs = p.read(w)
            out.append(figs)
            total = s if total is None else _add(total, s)
        if total is not None:
            _, _, tq = self.ttft.read(w, (50, 95, 99) if total[1] else ())
            _, _, eq = self.e2e.read(w, (95,) if total[7] else ())
            out.append(_figures(total, tq, eq))
        return out


def paired(
    strata: Mapping[str, tuple[Side, Side]],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, dict[str, Estimate]]:
    """Per class and :data:`OVERALL`, per :data:`METRICS` name: baseline (first of each
    pair), candidate, their ratio and its interval."""
    classes = [c for c, (a, _) in strata.items() if a.ok]
    if not classes:
        return {}
    base = _Run([strata[c][0] for c in classes])
    cand = _Run([strata[c][1] for c in classes])
    n = base.size
    groups = [*classes, OVERALL]
    ones = [1] * n
    point = list(zip(base.figures(ones), cand.figures(ones), strict=True))
    ratios: list[list[list[float]]] = [[[] for _ in METRICS] for _ in groups]
    rng = random.Random(seed)
    for _ in range(resamples):
        w = list(rng.randbytes(n).translate(_WEIGHTS))
        for g, (fa, fb) in enumerate(zip(base.figures(w), cand.figures(w), strict=True)):
            for k in range(len(METRICS)):
                r = _ratio(fa[k], fb[k])
                if r is not None:
                    ratios[g][k].append(r)
    out: dict[str, dict[str, Estimate]] = {}
    for g, name in enumerate(groups):
        fa, fb = point[g]
        out[name] = {}
        for k, metric in enumerate(METRICS):
            lo, hi = _interval(ratios[g][k], resamples)
            out[name][metric] = Estimate(fa[k], fb[k], _ratio(fa[k], fb[k]), lo, hi)
    return out


def window_ratio(
    baseline: tuple[Sequence[float], Sequence[float]],
    candidate: tuple[Sequence[float], Sequence[float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """Throughput's ratio and interval: each run as (tokens, seconds) per window of the
    trace, window ``i`` the same stretch of the trace in both; a window past one run's end
    counts no tokens and no seconds there."""
    (ta, sa), (tb, sb) = baseline, candidate
    if len(ta) != len(sa) or len(tb) != len(sb):
        raise ValueError("tokens and seconds per window differ in length")
    n = max(len(ta), len(tb))
    ta, sa = [*ta, *[0.0] * (n - len(ta))], [*sa, *[0.0] * (n - len(sa))]
    tb, sb = [*tb, *[0.0] * (n - len(tb))], [*sb, *[0.0] * (n - len(sb))]

    def rate(tok: Sequence[float], sec: Sequence[float], w: Sequence[int]) -> float | None:
        s = sum(map(operator.mul, w, sec))
        return sum(map(operator.mul, w, tok)) / s if s > 0 else None

    ones = [1] * n
    a, b = rate(ta, sa, ones), rate(tb, sb, ones)
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples if n > 1 else 0):
        w = list(rng.randbytes(n).translate(_WEIGHTS))
        r = _ratio(rate(ta, sa, w), rate(tb, sb, w))
        if r is not None:
            ratios.append(r)
    lo, hi = _interval(ratios, resamples if n > 1 else 0)
    return Estimate(a, b, _ratio(a, b), lo, hi)
