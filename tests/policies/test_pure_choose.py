"""``choose`` is pure for every built-in policy: asked again, it answers the same, and only
``committed`` moves what a policy learns from its choices (round-robin's turn, cache-aware's
record, adaptive's spills and pending predictions)."""

from __future__ import annotations

import pytest

from policies.base import Policy, reads_prefix
from policies.registry import BackendInfo, build_policy
from policies.testing import make_candidate as cand
from policies.testing import make_request
from policies.types import Candidate, RequestClass

BACKENDS = (
    BackendInfo("vllm", "vllm", priority_capable=True),
    BackendInfo("deepinfer", "deepinfer"),
)
ADAPTIVE: dict[str, object] = {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]}
BUILT: dict[str, dict[str, object]] = {
    "round-robin": {},
    "class-split": {"interactive": ["vllm", "deepinfer"], "batch": ["deepinfer", "vllm"]},
    "least-outstanding": {},
    "cache-aware": {},
    "adaptive": ADAPTIVE,
    "pipeline": {
        "scorers": [
            {"type": "predicted-ttft", "weight": 1.0},
            {"type": "cache-aware", "weight": 1.0},
        ],
        "picker": {"type": "round-robin"},
    },
}


def snapshot() -> list[Candidate]:
    return [
        cand("vllm", "vllm", inflight=3, prompt_tokens=4000, kv=0.4, waiting=1.0, running=3.0),
        cand("deepinfer", "deepinfer", inflight=2, prompt_tokens=9000, kv=0.5, waiting=2.0),
    ]


def answers(
    policy: Policy, cls: RequestClass, n: int
) -> list[tuple[tuple[str, ...], list[tuple[str, float]]]]:
    req = make_request(cls, request_id=f"{cls}-{n}", prefix_blocks=(1, 2, 3, n))
    out = []
    for _ in range(3):
        d = policy.choose(req, snapshot())
        out.append((d.ranked, sorted(d.scores.items())))
    return out


@pytest.mark.parametrize("kind", sorted(BUILT))
def test_choose_changes_nothing_committed_does(kind: str) -> None:
    policy = build_policy("p", kind, BUILT[kind], BACKENDS)
    for n in range(6):
        cls: RequestClass = "batch" if n % 2 else "interactive"
        first, *again = answers(policy, cls, n)
        assert again == [first, first], f"{kind}: choose gave another answer when asked again"
        req = make_request(cls, request_id=f"{cls}-{n}", prefix_blocks=(1, 2, 3, n))
        decision = policy.choose(req, snapshot())
        policy.committed(req, decision, decision.ranked[-1])


def test_round_robin_turns_only_when_a_request_is_sent() -> None:
    policy = build_policy("p", "round-robin", {}, BACKENDS)
    req = make_request()
    heads = [policy.choose(req, snapshot()).ranked[0] for _ in range(3)]
    assert heads == ["vllm"] * 3
    decision = policy.choose(req, snapshot())
    policy.committed(req, decision, decision.ranked[0])
    assert policy.choose(req, snapshot()).ranked[0] == "deepinfer"


def test_cache_aware_learns_the_placement_when_committed() -> None:
    policy = build_policy("p", "cache-aware", {}, BACKENDS)
    req = make_request(prefix_blocks=(7, 8, 9))
    assert policy.choose(req, snapshot()).scores == {"vllm": 0.0, "deepinfer": 0.0}
    decision = policy.choose(req, snapshot())
    policy.committed(req, decision, "deepinfer")
    assert policy.choose(req, snapshot()).scores["deepinfer"] == 1.0


@pytest.mark.parametrize(
    ("kind", "reads"),
    [
        ("round-robin", False),
        ("class-split", False),
        ("least-outstanding", False),
        ("cache-aware", True),
        ("adaptive", True),
        ("pipeline", True),  # its cache-aware scorer
    ],
)
def test_a_policy_says_whether_it_reads_the_prompt_prefix(kind: str, reads: bool) -> None:
    """The router hashes a prompt's prefix only for a policy that reads it."""
    assert reads_prefix(build_policy("p", kind, BUILT[kind], BACKENDS)) is reads
