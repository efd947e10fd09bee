"""Both profiles reproduce the public run in virtual time, within the stated tolerances."""

from __future__ import annotations

import pytest

from emulator.calibration import MIN_P95_TTFT_RATIO, SHAPE, compare, p95_ttft_ratio, table
from emulator.profiles import load_profile
from emulator.simulate import closed_loop


@pytest.fixture(scope="module")
def figures() -> dict[str, dict[str, float]]:
    return {name: closed_loop(load_profile(name), **SHAPE)[0] for name in ("vllm", "deepinfer")}


@pytest.mark.parametrize("name", ["vllm", "deepinfer"])
def test_profile_hits_published_figures(name: str, figures: dict[str, dict[str, float]]) -> None:
    rows = compare(name, figures[name])
    assert all(r.ok for r in rows), table(name, rows)
    assert figures[name]["completed"] == SHAPE["requests"]


def test_deepinfer_has_the_heavier_ttft_tail(figures: dict[str, dict[str, float]]) -> None:
    assert p95_ttft_ratio(figures["deepinfer"], figures["vllm"]) >= MIN_P95_TTFT_RATIO


def test_deepinfer_fit_holds_across_rank_draws() -> None:
    """Random rank assignment is seeded; the fit must not hinge on one lucky draw.

    One run of 100 requests is a single draw of the assignment (as the published run was), so
    single seeds scatter; the mean over draws must hold the tolerance, every draw a wider one.
    """
    vllm = closed_loop(load_profile("vllm"), **SHAPE)[0]
    draws = [closed_loop(load_profile("deepinfer"), seed=s, **SHAPE)[0] for s in range(1, 7)]
    for metric in ("mean_ttft_ms", "output_throughput", "mean_itl_ms"):
        ratios = [r.ratio for d in draws for r in compare("deepinfer", d) if r.metric == metric]
        assert abs(sum(ratios) / len(ratios) - 1) <= 0.10, (metric, ratios)
        assert all(abs(x - 1) <= 0.25 for x in ratios), (metric, ratios)
    assert all(p95_ttft_ratio(d, vllm) >= MIN_P95_TTFT_RATIO for d in draws)
