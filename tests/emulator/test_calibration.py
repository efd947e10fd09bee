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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_deepinfer_fit_holds_for_other_rank_draws(seed: int) -> None:
    """Random rank assignment is seeded; the fit must not hinge on one lucky draw."""
    vllm = closed_loop(load_profile("vllm"), **SHAPE)[0]
    ours = closed_loop(load_profile("deepinfer"), seed=seed, **SHAPE)[0]
    rows = {r.metric: r for r in compare("deepinfer", ours)}
    assert abs(rows["mean_itl_ms"].ratio - 1) <= 0.10
    assert abs(rows["mean_ttft_ms"].ratio - 1) <= 0.20
    assert abs(rows["output_throughput"].ratio - 1) <= 0.15
    assert p95_ttft_ratio(ours, vllm) >= MIN_P95_TTFT_RATIO
