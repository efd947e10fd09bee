"""The report's comparison: runs paired by custom_id, the A/A noise floor, the verdict line."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from replay.client import Result
from replay.compare import BOOTSTRAP_CAP, comparison, estimates, percent
from replay.pairs import Requests, strata
from replay.timeline import Frame, Timeline

SLO = {"interactive": (0.5, 0.05)}


def _result(cid: str, cls: str, ttft: float, tokens: int) -> Result:
    e2e = ttft + 0.02 * (tokens - 1)
    return Result(
        cid,
        cls,
        200,
        True,
        0.0,
        backend="vllm",
        ttft=ttft,
        e2e=e2e,
        itls=[0.02] * (tokens - 1),
        prompt_tokens=500,
        completion_tokens=tokens,
    )


def _run(label: str, seed: int, interactive: float = 1.0, *, aa: bool = False) -> dict[str, object]:
    """A run of one synthetic trace (fixed per request), ``interactive`` times as slow to
    the first token there, each request off by its own noise."""
    trace, noise = random.Random(0), random.Random(seed)
    requests, timeline = Requests(), Timeline(Frame(slo=SLO))
    for k in range(300):
        cls = "batch" if k % 3 == 0 else "interactive"
        ttft = trace.lognormvariate(-1.5, 0.5) * noise.lognormvariate(0, 0.05)
        if cls == "interactive":
            ttft *= interactive
        r = _result(f"r{k}", cls, ttft, 50 if cls == "batch" else 20)
        requests.add(r, timeline.good(r))
        timeline.add(r, sent=k * 0.1)
    return {
        "policy": label,
        "aa": aa,
        "requests": requests.to_dict(),
        "timeline": timeline.to_dict(29.9 + 1.0),
    }


def test_verdicts_against_the_noise_floor_and_the_line_that_says_them() -> None:
    runs = [
        _run("class-split", 1),
        _run("adaptive", 2, interactive=0.8),
        _run("class-split (A/A)", 3, aa=True),
    ]
    doc = comparison(runs, resamples=300)
    assert doc is not None
    assert doc["baseline"] == "class-split" and doc["aa"]["run"] == "class-split (A/A)"
    (cand,) = doc["candidates"]
    assert cand["run"] == "adaptive" and cand["matched"] == 300
    inter, batch = cand["groups"]["interactive"], cand["groups"]["batch"]
    p95 = inter["p95_ttft_ms"]
    assert p95["verdict"] == "better" and 0.75 < p95["ratio"] < 0.85
    lo, hi = p95["ci"]
    assert lo < p95["ratio"] < hi < 1 - p95["noise"]
    assert batch["p95_ttft_ms"]["verdict"] == "no difference"
    assert inter["success_rate"]["ratio"] == 1.0
    assert inter["goodput"]["ratio"] >= 1.0
    # interactive is faster to its first token, not in its output: throughput holds
    out = cand["groups"]["overall"]["output_throughput"]
    assert out["ratio"] == pytest.approx(1.0, abs=1e-3) and out["verdict"] == "no difference"
    floor = doc["noise_floor"]["interactive"]["p95_ttft_ms"]
    assert floor == abs(doc["aa"]["groups"]["interactive"]["p95_ttft_ms"]["ratio"] - 1)
    (line,) = doc["lines"]
    change = f"{percent(p95['ratio'])} [{percent(lo)}, {percent(hi)}]"
    assert line.startswith(
        "adaptive vs class-split: batch P95 TTFT no difference, output no difference; "
        f"interactive P95 TTFT {change} better, output no difference, "
    )
    assert "; A/A noise ±" in line and line.endswith(" output")


def test_without_an_aa_run_the_line_says_there_is_no_noise_floor() -> None:
    doc = comparison([_run("a", 1), _run("b", 2)], resamples=200)
    assert doc is not None and doc["aa"] is None and doc["noise_floor"] is None
    assert doc["candidates"][0]["groups"]["batch"]["p95_ttft_ms"]["noise"] is None
    assert doc["lines"][0].endswith("; no A/A run (--aa), so no noise floor")
    assert comparison([_run("a", 1)]) is None


def test_runs_pair_on_the_requests_both_kept() -> None:
    a, b = Requests(cap=100), Requests(cap=100)
    ids = [f"req-{k}" for k in range(1000)]
    for cid in ids:
        a.add(_result(cid, "interactive", 0.1, 5), True)
    for cid in reversed(ids):  # another order: the same sample
        b.add(_result(cid, "interactive", 0.2, 5), None)
    b.add(_result("req-7", "interactive", 9.0, 5), None)
    da, db = a.to_dict(), b.to_dict()
    assert 50 <= len(da["ids"]) <= 100 and da["sampled"] < 0.13
    assert set(da["ids"]) == set(db["ids"]) and da["sampled"] == db["sampled"]
    pairs, matched = strata(da, db)
    assert matched == len(da["ids"])
    sa, sb = pairs["interactive"]
    assert sa.ttft[0] == 100.0 and sb.ttft[0] == 200.0
    assert sa.good is None and sb.good is None  # judged in one run only: in neither
    assert db["duplicates"] == ("req-7" in db["ids"])


def test_a_large_trace_is_resampled_in_part_and_its_interval_narrowed_to_the_whole() -> None:
    trace, noise = random.Random(0), random.Random(1)
    n = 12_000  # more than a run keeps (10,000): each keeps a hashed half or so
    a, b = Requests(), Requests()
    ttft_a, ttft_b = [], []
    for k in range(n):
        base = trace.lognormvariate(-1.5, 0.5)
        ta, tb = base * noise.lognormvariate(0, 0.1), 1.1 * base * noise.lognormvariate(0, 0.1)
        ttft_a.append(ta)
        ttft_b.append(tb)
        a.add(_result(f"r{k}", "interactive", ta, 20), None)
        b.add(_result(f"r{k}", "interactive", tb, 20), None)
    kept_a, kept_b = a.to_dict(), b.to_dict()
    assert kept_a["sampled"] == 0.5
    got, matched = estimates(
        {"policy": "a", "requests": kept_a}, {"policy": "b", "requests": kept_b}, resamples=300
    )
    mean = got["interactive"]["mean_ttft_ms"]
    assert matched == len(kept_a["ids"]) > BOOTSTRAP_CAP
    # the ratio over every kept request; the interval as wide as the whole trace's: the
    # delta method's over all 12,000 (paired: the difference's spread counts)
    assert mean.ratio == pytest.approx(sum(ttft_b) / sum(ttft_a), rel=0.01)
    assert mean.lo is not None and mean.hi is not None and mean.ratio is not None
    assert mean.lo < mean.ratio < mean.hi
    r = sum(ttft_b) / sum(ttft_a)
    d = [y - r * x for x, y in zip(ttft_a, ttft_b, strict=True)]
    half = 1.96 * statistics.stdev(d) / math.sqrt(n) / statistics.fmean(ttft_a)
    assert (mean.hi - mean.lo) / 2 == pytest.approx(half, rel=0.25)


def test_percent() -> None:
    assert percent(1.28) == "+28%"
    assert percent(0.82) == "\u221218%"
    assert percent(0.965) == "\u22123.5%"
    assert percent(1.0) == "+0.0%"
