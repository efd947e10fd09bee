"""The report's ``comparison``: each candidate run against the baseline, with intervals, the
A/A noise floor and a verdict per class and headline metric; and the verdict line.

The baseline is the first run that is not an A/A run. An A/A run (``"aa": true``, the second
run of the baseline's policy that ``--aa`` adds) is compared with the baseline like a
candidate; how far from equal the two came out is the noise floor of that class and metric:
what drift between runs (warm-up, caches, the machine's other work) and chance amount to on
this trace and target. A candidate's verdict is ``better`` or ``worse`` when its whole
interval lies beyond the noise floor on one side, else ``no difference``. With no A/A run the
floor is zero and the verdict is the interval's alone: an A/A pair then comes out ``no
difference`` 95% of the time, the interval's level; judged against a floor, more often.
Intervals come from :mod:`replay.bootstrap` over the requests both runs answered
(:mod:`replay.pairs`), throughput's over the windows of the runs' timelines
(:mod:`replay.timeline`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from replay.bootstrap import LEVEL, METRICS, OVERALL, RESAMPLES, Estimate, paired, window_ratio
from replay.cost import price
from replay.pairs import strata

HEADLINE = (*METRICS, "output_throughput")
BOOTSTRAP_CAP = 4000
"""Matched requests a comparison resamples at most: a few seconds of one core's time."""
HIGHER_IS_BETTER = frozenset({"output_throughput", "goodput", "success_rate"})
SHORT = {
    "mean_ttft_ms": "mean TTFT",
    "median_ttft_ms": "P50 TTFT",
    "p95_ttft_ms": "P95 TTFT",
    "p99_ttft_ms": "P99 TTFT",
    "mean_tpot_ms": "mean TPOT",
    "mean_itl_ms": "mean ITL",
    "mean_e2el_ms": "mean E2E",
    "p95_e2el_ms": "P95 E2E",
    "goodput": "goodput",
    "success_rate": "success",
    "output_throughput": "output",
}
"""How the verdict line names each headline metric."""
TTFT = ("mean_ttft_ms", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms")
REST = ("mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "p95_e2el_ms", "output_throughput")
"""A simulator's error by metric: TTFT's figures, judged apart, then the others."""
KEY = ("p95_ttft_ms", "output_throughput")
"""Named on the verdict line per class whatever their verdict."""
LINE_EXTRA = 2
"""Other significant differences the verdict line names per class, the largest first."""
MINUS = "\u2212"
AA_SUFFIX = " (A/A)"
"""Added to the baseline's label to name its A/A run."""


def label(run: Mapping[str, Any]) -> str:
    """A run's name in tables and lines."""
    return str(run.get("policy") or "target")


def verdict(metric: str, est: Estimate, noise: float | None) -> str | None:
    """``better``, ``worse`` or ``no difference`` (None: no interval to judge by)."""
    if est.lo is None or est.hi is None:
        return None
    floor = noise or 0.0
    if est.lo > 1.0 + floor:
        up = True
    elif est.hi < 1.0 - floor:
        up = False
    else:
        return "no difference"
    return "better" if up == (metric in HIGHER_IS_BETTER) else "worse"


def noise(aa: Estimate) -> float | None:
    """The noise floor an A/A estimate sets: how far from equal two runs of one policy came
    out (None: not measured)."""
    return None if aa.ratio is None else abs(aa.ratio - 1.0)


def _seed(*names: str) -> int:
    """The same runs give the same draws, so a report is reproducible."""
    return zlib.crc32("\0".join(names).encode())


def _windows(run: Mapping[str, Any], group: str) -> tuple[list[float], list[float]] | None:
    timeline = run.get("timeline")
    if not timeline:
        return None
    series = timeline["groups"].get("all" if group == OVERALL else group)
    if series is None:
        return None
    return [float(v) for v in series["out_tokens"]], [float(v) for v in timeline["seconds"]]


def estimates(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any], *, resamples: int = RESAMPLES
) -> tuple[dict[str, dict[str, Estimate]], int]:
    """Per class and overall, per :data:`HEADLINE` metric: the candidate against the
    baseline; and how many requests the two runs share.

    The figures and ratios come from every request both runs kept; past
    :data:`BOOTSTRAP_CAP` of them the intervals are drawn from a hashed sample of that many
    and narrowed to the trace's size (:func:`_narrowed`).
    """
    a, b = baseline["requests"], candidate["requests"]
    pairs, matched = strata(a, b)
    seed = _seed(label(baseline), label(candidate))
    if matched <= BOOTSTRAP_CAP and min(a["sampled"], b["sampled"]) == 1.0:
        out = paired(pairs, resamples=resamples, seed=seed)
    else:
        whole = paired(pairs, resamples=0)
        drawn = paired(strata(a, b, cap=BOOTSTRAP_CAP)[0], resamples=resamples, seed=seed)
        # the trace's requests both runs answered, of which the tables kept a share
        total = matched / min(a["sampled"], b["sampled"])
        scale = math.sqrt(min(matched, BOOTSTRAP_CAP) / total)
        out = {
            g: {m: _narrowed(e, drawn.get(g, {}).get(m), scale) for m, e in f.items()}
            for g, f in whole.items()
        }
    same_windows = _window_s(baseline) == _window_s(candidate)
    for group, figures in out.items():
        wa, wb = _windows(baseline, group), _windows(candidate, group)
        if wa is not None and wb is not None and same_windows:
            figures["output_throughput"] = window_ratio(wa, wb, resamples=resamples, seed=seed)
        else:
            figures["output_throughput"] = Estimate(None, None, None, None, None)
    return out, matched


def _narrowed(whole: Estimate, drawn: Estimate | None, scale: float) -> Estimate:
    """``whole``'s figures with ``drawn``'s interval around its own ratio, each end's
    distance from that ratio (on a log scale: ratios multiply) times ``scale``, so placed
    around ``whole``'s ratio: an interval narrows with the square root of the requests it
    is computed over, and ``drawn``'s was computed over ``scale ** 2`` times the trace's."""
    if (
        drawn is None
        or whole.ratio is None
        or drawn.ratio is None
        or drawn.lo is None
        or drawn.hi is None
        or drawn.lo <= 0
    ):
        return Estimate(whole.baseline, whole.candidate, whole.ratio, None, None)
    centre, log = math.log(drawn.ratio), math.log(whole.ratio)
    lo = math.exp(log - scale * (centre - math.log(drawn.lo)))
    hi = math.exp(log + scale * (math.log(drawn.hi) - centre))
    return Estimate(whole.baseline, whole.candidate, whole.ratio, lo, hi)


def _window_s(run: Mapping[str, Any]) -> float | None:
    timeline = run.get("timeline")
    return None if not timeline else timeline["window_s"]


def _entry(metric: str, est: Estimate, noise: float | None) -> dict[str, Any]:
    return {
        "baseline": est.baseline,
        "candidate": est.candidate,
        "ratio": est.ratio,
        "ci": None if est.lo is None else [est.lo, est.hi],
        "noise": noise,
        "verdict": verdict(metric, est, noise),
    }


Pairs = Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]
"""(baseline run, candidate run) to compare."""


def comparison(
    runs: Sequence[Mapping[str, Any]], *, pairs: Pairs | None = None, resamples: int = RESAMPLES
) -> dict[str, Any] | None:
    """The report's ``comparison`` section, or None with fewer than two runs to compare.

    ``pairs`` default to every run that is neither the baseline nor an A/A run against the
    baseline; the noise floor is that of the first A/A run in ``runs`` against the run it
    repeats (named as it is, less the A/A mark).
    """
    usable = [r for r in runs if r.get("requests")]
    plain = [r for r in usable if not r.get("aa")]
    if not plain or len(usable) < 2:
        return None
    base = plain[0]
    aa = next((r for r in usable if r.get("aa")), None)
    floor: dict[str, dict[str, float | None]] | None = None
    aa_doc = None
    if aa is not None:  # against the run it repeats
        twin = next((r for r in plain if label(r) + AA_SUFFIX == label(aa)), base)
        got, matched = estimates(twin, aa, resamples=resamples)
        floor = {g: {m: noise(e) for m, e in f.items()} for g, f in got.items()}
        groups = {g: {m: _entry(m, e, None) for m, e in f.items()} for g, f in got.items()}
        aa_doc = {"run": label(aa), "matched": matched, "groups": groups}
    candidates = []
    for before, after in [(base, r) for r in plain[1:]] if pairs is None else pairs:
        got, matched = estimates(before, after, resamples=resamples)
        groups = {
            g: {m: _entry(m, e, (floor or {}).get(g, {}).get(m)) for m, e in f.items()}
            for g, f in got.items()
        }
        candidates.append(
            {"run": label(after), "baseline": label(before), "matched": matched, "groups": groups}
        )
    doc: dict[str, Any] = {
        "baseline": label(base),
        "method": {
            "level": LEVEL,
            "resamples": resamples,
            "pairs": "custom_id",
            "sampled": base["requests"]["sampled"],
            "throughput": "windows",
        },
        "aa": aa_doc,
        "noise_floor": floor,
        "candidates": candidates,
    }
    doc["lines"] = verdict_lines(doc)
    return doc


def price_runs(report: dict[str, Any], pricing: Mapping[str, float]) -> None:
    """Give each run of ``report`` its ``cost`` at ``pricing`` (None without prices)."""
    report["pricing"] = {name: {"usd_per_hour": usd} for name, usd in sorted(pricing.items())}
    for run in report["runs"]:
        run["cost"] = price(run["by_backend"], pricing) if pricing else None


def annotate(
    report: dict[str, Any],
    pricing: Mapping[str, float],
    *,
    compare: bool = True,
    resamples: int = RESAMPLES,
) -> dict[str, Any]:
    """``report`` with each run's cost at ``pricing``, the prices and the ``comparison``
    (None with one run, or when not asked to ``compare``)."""
    price_runs(report, pricing)
    report["comparison"] = comparison(report["runs"], resamples=resamples) if compare else None
    return report


def percent(ratio: float) -> str:
    """A ratio as a signed change: ``+28%``, ``−3.5%`` (a decimal below 10%)."""
    x = (ratio - 1.0) * 100.0
    text = f"{x:+.0f}%" if abs(x) >= 9.95 else f"{x:+.1f}%"
    return text.replace("-", MINUS)


def _size(e: Mapping[str, Any]) -> float:
    return abs(float(e["ratio"]) - 1.0)


def _change(e: Mapping[str, Any]) -> str:
    lo, hi = e["ci"]
    return f"{percent(e['ratio'])} [{percent(lo)}, {percent(hi)}]"


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per candidate: per class, the key metrics and the largest other significant
    differences with their intervals and verdicts, what does not differ named as such; then
    the noise floor."""
    lines = []
    for cand in doc["candidates"]:
        groups = cand["groups"]
        classes = [g for g in groups if g != OVERALL] or [OVERALL]
        parts = []
        for g in classes:
            figures = groups[g]
            hits = [m for m, e in figures.items() if e["verdict"] in ("better", "worse")]
            extra = sorted((m for m in hits if m not in KEY), key=lambda m: -_size(figures[m]))
            said = []
            for m in [*KEY, *extra[:LINE_EXTRA]]:
                e = figures[m]
                if e["verdict"] == "no difference":
                    said.append(f"{SHORT[m]} no difference")
                elif e["verdict"] is not None:
                    said.append(f"{SHORT[m]} {_change(e)} {e['verdict']}")
            if said:
                parts.append(("" if g == OVERALL else g + " ") + ", ".join(said))
        body = "; ".join(parts) if parts else "nothing measured in both"
        lines.append(f"{cand['run']} vs {cand['baseline']}: {body}; {_noise_text(doc, classes)}")
    return lines


def _noise_text(doc: Mapping[str, Any], classes: Sequence[str]) -> str:
    floor = doc["noise_floor"]
    if floor is None:
        return "no A/A run (--aa), so no noise floor"
    parts = []
    for m in KEY:
        values = [floor[g][m] for g in classes if g in floor and floor[g].get(m) is not None]
        if values:
            parts.append(f"±{percent(1.0 + max(values))[1:]} {SHORT[m]}")
    return "A/A noise " + (", ".join(parts) if parts else "not measured")
