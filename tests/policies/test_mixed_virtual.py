"""The policies' feedback loop against the emulator's engine model, in virtual time."""

from __future__ import annotations

import pytest

from tests.policies.virtual_mix import Figures, run


@pytest.fixture(scope="module")
def figures() -> dict[str, Figures]:
    return {name: run(name) for name in ("round-robin", "class-split", "adaptive")}


def test_adaptive_keeps_interactive_fast_and_lends_idle_capacity_to_batch(
    figures: dict[str, Figures],
) -> None:
    adaptive, rr, split = figures["adaptive"], figures["round-robin"], figures["class-split"]
    assert split.spilled == 0 and adaptive.spilled > 0
    assert adaptive.interactive_p95_ttft <= 0.6 * rr.interactive_p95_ttft
    assert adaptive.interactive_p95_ttft <= 0.5  # the SLO
    assert adaptive.batch_tokens_per_s >= 1.03 * split.batch_tokens_per_s
