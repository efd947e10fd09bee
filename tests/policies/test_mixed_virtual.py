"""The policies' feedback loop against the emulator's engine model, in virtual time.

Two engine pairs, pinned in virtual_mix: one where lending vLLM's idle capacity to batch
pays (a fast-prefill vLLM), one where it does not (eight slower vLLM ranks). Adaptive must
find out which by itself.
"""

from __future__ import annotations

import pytest

from tests.policies.virtual_mix import (
    EIGHT_RANK_VLLM,
    FAST_PREFILL_VLLM,
    SLO_TTFT_S,
    Figures,
    run,
)

COMPARED = ("round-robin", "class-split", "adaptive")


@pytest.fixture(scope="module")
def spill_pays() -> dict[str, Figures]:
    return {name: run(name, overrides=FAST_PREFILL_VLLM) for name in COMPARED}


@pytest.fixture(scope="module")
def spill_costs() -> dict[str, Figures]:
    return {name: run(name, overrides=EIGHT_RANK_VLLM) for name in COMPARED}


def test_adaptive_lends_idle_capacity_when_it_pays(spill_pays: dict[str, Figures]) -> None:
    rr, split, adaptive = (spill_pays[n] for n in COMPARED)
    assert split.spilled == 0 and adaptive.spilled > 0
    assert adaptive.interactive_p95_ttft <= 0.6 * rr.interactive_p95_ttft
    assert adaptive.interactive_p95_ttft <= SLO_TTFT_S
    assert adaptive.batch_tokens_per_s >= 1.05 * split.batch_tokens_per_s


def test_adaptive_holds_back_when_lending_does_not_pay(spill_costs: dict[str, Figures]) -> None:
    rr, split, adaptive = (spill_costs[n] for n in COMPARED)
    assert rr.batch_tokens_per_s < split.batch_tokens_per_s  # spilling costs batch here
    assert adaptive.interactive_p95_ttft <= 0.6 * rr.interactive_p95_ttft
    assert adaptive.interactive_slo_attainment >= 0.95
    assert adaptive.batch_tokens_per_s >= 0.97 * split.batch_tokens_per_s
