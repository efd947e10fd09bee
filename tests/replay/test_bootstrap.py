"""The paired bootstrap on synthetic runs whose difference is known, zero included."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from replay.bootstrap import METRICS, OVERALL, Estimate, Side, paired, quantile, window_ratio
from replay.compare import noise, verdict
from replay.stats import Column

LATENCIES = ("mean_ttft_ms", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_e2el_ms")


def _side(ttft: list[float], *, ok: list[int] | None = None, good: bool = True) -> Side:
    """A run whose TPOT, gaps and E2E follow its TTFT (ms); NaN where a request failed."""
    ok = ok if ok is not None else [1] * len(ttft)
    nan = math.nan
    return Side(
        ttft=[t if k else nan for t, k in zip(ttft, ok, strict=True)],
        tpot=[t / 20 if k else nan for t, k in zip(ttft, ok, strict=True)],
        itl_sum=[t / 2 if k else 0.0 for t, k in zip(ttft, ok, strict=True)],
        itl_n=[10 * k for k in ok],
        e2e=[t + 400 if k else nan for t, k in zip(ttft, ok, strict=True)],
        ok=ok,
        good=[int(k and t < 300) for t, k in zip(ttft, ok, strict=True)] if good else None,
    )


def _trace(rng: random.Random, n: int) -> list[float]:
    """Per request, how slow it is under any policy (ms): most of a run's variance."""
    return [rng.lognormvariate(5.0, 0.6) for _ in range(n)]


def _run(rng: random.Random, base: list[float], scale: float = 1.0) -> Side:
    """One run over ``base``: each request scaled, and off by its own noise (about 10%)."""
    return _side([t * scale * rng.lognormvariate(0.0, 0.1) for t in base])


def test_figures_over_every_request_once_are_the_reports() -> None:
    rng = random.Random(7)
    values = _trace(rng, 301)
    ok = [0 if i % 50 == 0 else 1 for i in range(301)]
    side = _side(values, ok=ok)
    got = paired({"c": (side, side)}, resamples=0)["c"]
    column = Column()
    for t, k in zip(values, ok, strict=True):
        if k:
            column.add(t)
    p50, p95, p99 = column.quantiles((50, 95, 99))
    assert got["mean_ttft_ms"].baseline == pytest.approx(column.mean)
    assert got["median_ttft_ms"].baseline == pytest.approx(p50)
    assert got["p95_ttft_ms"].baseline == pytest.approx(p95)
    assert got["p99_ttft_ms"].baseline == pytest.approx(p99)
    served = [t for t, k in zip(values, ok, strict=True) if k]
    assert got["mean_itl_ms"].baseline == pytest.approx(sum(served) / 2 / (10 * len(served)))
    assert got["mean_tpot_ms"].baseline == pytest.approx(statistics.fmean(served) / 20)
    assert got["success_rate"].baseline == pytest.approx(sum(ok) / 301)
    assert got["goodput"].baseline == pytest.approx(sum(t < 300 for t in served) / 301)
    assert got["p95_ttft_ms"].lo is None  # no resamples, no interval


def test_a_scaled_copy_has_exactly_that_ratio_in_every_resample() -> None:
    base = _trace(random.Random(1), 200)
    got = paired({"c": (_side(base), _side([t * 1.25 for t in base]))}, resamples=200)
    for group in ("c", OVERALL):
        for m in ("mean_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms"):
            e = got[group][m]
            assert e.ratio == pytest.approx(1.25)
            assert e.lo == pytest.approx(1.25) and e.hi == pytest.approx(1.25)
        assert got[group]["success_rate"].ratio == 1.0


def test_identical_runs_differ_by_nothing() -> None:
    side = _side(_trace(random.Random(2), 120))
    got = paired({"c": (side, side)}, resamples=200)
    for m in METRICS:
        e = got["c"][m]
        assert (e.ratio, e.lo, e.hi) == (1.0, 1.0, 1.0), m
        assert verdict(m, e, None) == "no difference"


def test_the_interval_is_as_wide_as_the_mean_difference_s_standard_error() -> None:
    rng = random.Random(3)
    base = _trace(rng, 800)
    a, b = _run(rng, base), _run(rng, base, 1.1)
    got = paired({"c": (a, b)}, resamples=600, seed=1)["c"]["mean_ttft_ms"]
    assert got.lo is not None and got.hi is not None
    # the delta method: ratio of means, paired, so the difference's spread is what counts
    mean_a = statistics.fmean(a.ttft)
    d = [y - got.ratio * x for x, y in zip(a.ttft, b.ttft, strict=True)] if got.ratio else []
    half = 1.96 * statistics.stdev(d) / math.sqrt(len(d)) / mean_a
    assert (got.hi - got.lo) / 2 == pytest.approx(half, rel=0.15)


def test_classes_are_strata_and_the_overall_figure_pools_them() -> None:
    rng = random.Random(4)
    fast, slow = _trace(rng, 150), [t * 10 for t in _trace(rng, 50)]
    got = paired(
        {
            "interactive": (_side(fast), _side([t * 1.5 for t in fast])),
            "batch": (_side(slow), _side(slow)),
        },
        resamples=200,
    )
    assert got["interactive"]["mean_ttft_ms"].ratio == pytest.approx(1.5)
    assert got["batch"]["mean_ttft_ms"].ratio == pytest.approx(1.0)
    whole = (sum(fast) * 1.5 + sum(slow)) / (sum(fast) + sum(slow))
    assert got[OVERALL]["mean_ttft_ms"].ratio == pytest.approx(whole)


Verdicts = dict[str, list[str | None]]


def _trials(n_trials: int, scale: float) -> tuple[Verdicts, Verdicts]:
    """Verdicts of ``n_trials`` synthetic comparisons, each on a fresh trace of 100 requests,
    of a candidate ``scale`` times the baseline: without a noise floor, and against the floor
    a third run (an A/A run) sets."""
    rng = random.Random(11)
    bare: Verdicts = {m: [] for m in LATENCIES}
    floored: Verdicts = {m: [] for m in LATENCIES}
    for trial in range(n_trials):
        base = _trace(rng, 100)
        a = _run(rng, base)
        got = paired({"c": (a, _run(rng, base, scale))}, resamples=200, seed=trial)["c"]
        aa = paired({"c": (a, _run(rng, base))}, resamples=0)["c"]
        for m in LATENCIES:
            bare[m].append(verdict(m, got[m], None))
            floored[m].append(verdict(m, got[m], noise(aa[m])))
    return bare, floored


@pytest.fixture(scope="module")
def aa_trials() -> tuple[Verdicts, Verdicts]:
    return _trials(120, 1.0)


def _rate(verdicts: Verdicts, which: str) -> float:
    return sum(v.count(which) for v in verdicts.values()) / sum(map(len, verdicts.values()))


def test_an_aa_pair_comes_out_no_difference_at_the_interval_s_level(
    aa_trials: tuple[Verdicts, Verdicts],
) -> None:
    bare, _ = aa_trials
    rates = {m: v.count("no difference") / len(v) for m, v in bare.items()}
    assert _rate(bare, "no difference") >= 0.93, rates  # 95% intervals: 95% no difference
    assert min(rates.values()) >= 0.88, rates


def test_against_the_noise_floor_an_aa_pair_differs_even_less_often(
    aa_trials: tuple[Verdicts, Verdicts],
) -> None:
    bare, floored = aa_trials
    assert _rate(floored, "no difference") >= max(0.97, _rate(bare, "no difference"))


def test_a_known_difference_is_found_and_its_interval_covers_it() -> None:
    _, floored = _trials(60, 1.2)
    for m in ("mean_ttft_ms", "mean_e2el_ms"):
        assert floored[m].count("worse") / 60 >= 0.95, m  # slower is worse
    assert floored["median_ttft_ms"].count("worse") / 60 >= 0.8  # a median is noisier
    assert _rate(floored, "better") == 0.0
    rng = random.Random(5)
    covered = 0
    for trial in range(80):
        base = _trace(rng, 60)
        e = paired({"c": (_run(rng, base), _run(rng, base, 1.2))}, resamples=200, seed=trial)
        lo, hi = e["c"]["mean_ttft_ms"].lo, e["c"]["mean_ttft_ms"].hi
        assert lo is not None and hi is not None
        covered += lo <= 1.2 <= hi
    assert covered >= 70  # a 95% interval: 76 expected


def test_higher_is_better_for_throughput_goodput_and_success() -> None:
    up = Estimate(1.0, 1.3, 1.3, 1.2, 1.4)
    assert verdict("output_throughput", up, 0.05) == "better"
    assert verdict("success_rate", up, 0.05) == "better"
    assert verdict("p95_ttft_ms", up, 0.05) == "worse"
    assert verdict("p95_ttft_ms", up, 0.25) == "no difference"  # within the noise floor
    down = Estimate(1.0, 0.8, 0.8, 0.75, 0.85)
    assert verdict("p95_ttft_ms", down, None) == "better"
    assert verdict("goodput", down, None) == "worse"
    assert verdict("goodput", Estimate(1.0, None, None, None, None), None) is None


def test_throughput_over_windows() -> None:
    tokens = [100.0, 250.0, 80.0, 300.0, 120.0, 90.0]
    seconds = [10.0] * 6
    same = window_ratio((tokens, seconds), (tokens, seconds), resamples=200)
    assert (same.ratio, same.lo, same.hi) == (1.0, 1.0, 1.0)
    # the same tokens, finished one window later: the candidate's run is a window longer
    later = window_ratio((tokens, seconds), ([0.0, *tokens], [10.0] * 7), resamples=500)
    assert later.ratio == pytest.approx(6 / 7)
    assert later.lo is not None and later.hi is not None and later.lo < 6 / 7 < later.hi
    doubled = window_ratio((tokens, seconds), ([2 * t for t in tokens], seconds), resamples=200)
    assert (doubled.ratio, doubled.lo, doubled.hi) == (2.0, 2.0, 2.0)


def test_quantile_interpolates_as_numpy() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert quantile([], 50) is None
