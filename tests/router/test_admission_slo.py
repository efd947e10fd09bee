"""Which SLOs each policy's goodput is judged against."""

from __future__ import annotations

from policies.base import Policy
from policies.registry import BackendInfo, build_policy
from policies.types import Slo
from router.control.slo import slo_table

BACKENDS = [BackendInfo("v", "vllm", True), BackendInfo("d", "deepinfer")]


def adaptive(name: str, ttft: float) -> Policy:
    params = {
        "low_ttft": ["vllm"],
        "high_throughput": ["deepinfer"],
        "slo": {"interactive": {"ttft_s": ttft, "tpot_s": 0.05}},
    }
    return build_policy(name, "adaptive", params, BACKENDS)


def test_policies_share_the_default_adaptive_slos() -> None:
    policies = {
        "rr": build_policy("rr", "round-robin", {}, BACKENDS),
        "fast": adaptive("fast", 0.2),
        "slow": adaptive("slow", 2.0),
    }
    table = slo_table(policies, "slow")
    assert table["rr"]["interactive"] == Slo(2.0, 0.05)
    assert table["slow"]["interactive"] == Slo(2.0, 0.05)
    assert table["fast"]["interactive"] == Slo(0.2, 0.05)  # an adaptive policy keeps its own


def test_first_adaptive_when_the_default_is_not_adaptive() -> None:
    policies = {"rr": build_policy("rr", "round-robin", {}, BACKENDS), "a": adaptive("a", 0.7)}
    assert slo_table(policies, "rr")["rr"]["interactive"] == Slo(0.7, 0.05)


def test_no_adaptive_policy_no_goodput() -> None:
    assert slo_table({"rr": build_policy("rr", "round-robin", {}, BACKENDS)}, "rr") == {}
