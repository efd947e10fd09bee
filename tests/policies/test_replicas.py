"""Replicas discovered behind a configured backend (``vllm@10.0.0.7``): policies built
against the configured name route to them, start them from that backend's priors, and forget
what they learned of one that left (policies.base.Forgets)."""

from __future__ import annotations

import pytest

from policies.adaptive import AdaptivePolicy
from policies.base import Forgets
from policies.registry import build_policy
from policies.testing import make_candidate, make_request, send
from policies.types import BackendInfo, Outcome, group_of

BACKENDS = [BackendInfo("vllm", "vllm"), BackendInfo("deepinfer", "deepinfer")]
ONE, TWO = "vllm@10.0.0.7", "vllm@fd00::8"


def test_group_of() -> None:
    assert group_of(ONE) == "vllm" and group_of(TWO) == "vllm"
    assert group_of("vllm") == "vllm"


def test_a_policy_naming_the_backend_routes_to_its_replicas() -> None:
    pinned = build_policy("p", "pinned", {"backend": "vllm"}, BACKENDS)
    split = build_policy(
        "s", "class-split", {"interactive": ["vllm"], "batch": ["deepinfer"]}, BACKENDS
    )
    candidates = [make_candidate(ONE, "vllm"), make_candidate("deepinfer")]
    assert send(pinned, make_request(), candidates).ranked == (ONE,)
    assert send(split, make_request(), candidates).ranked == (ONE,)


def _learn(policy: AdaptivePolicy, backend: str, ttft: float) -> None:
    for i in range(20):
        req = make_request(request_id=f"r{i}", prompt_tokens=1000)
        send(policy, req, [make_candidate(backend, "vllm"), make_candidate("deepinfer")])
        policy.on_finish(req, backend, Outcome(200, True, 1000, 10, ttft, ttft + 1, 0.02))


def test_adaptive_starts_a_replica_from_its_backends_prior_and_forgets_it() -> None:
    params = {
        "low_ttft": ["vllm"],
        "high_throughput": ["deepinfer"],
        "prefill_rate_prior": {"vllm": 50_000.0, "deepinfer": 5_000.0},
    }
    policy = build_policy("a", "adaptive", params, BACKENDS)
    assert isinstance(policy, AdaptivePolicy) and isinstance(policy, Forgets)
    assert policy.predictor.rate(ONE) == 50_000.0  # the configured backend's prior
    assert policy.predictor.predict(ONE, 0.0, 1000) == pytest.approx(0.02)
    _learn(policy, ONE, ttft=1.0)  # a second for 1000 tokens: far slower than the prior
    assert policy.predictor.predict(ONE, 0.0, 1000) == pytest.approx(1.0, rel=0.05)
    policy.forget(ONE)
    assert policy.predictor.rate(ONE) == 50_000.0  # a replica that comes back starts afresh
    assert policy.predictor.rate(TWO) == 50_000.0


def test_a_pipeline_forwards_forget_to_its_learning_plugins() -> None:
    params = {"scorers": [{"type": "predicted-ttft", "params": {"prefill_rate_prior": 20_000}}]}
    policy = build_policy("p", "pipeline", params, BACKENDS)
    assert isinstance(policy, Forgets)
    req = make_request()
    send(policy, req, [make_candidate(ONE, "vllm")])
    policy.on_finish(req, ONE, Outcome(200, True, 1000, 10, 2.0, 3.0, 0.02))
    before = send(policy, req, [make_candidate(ONE, "vllm")]).scores[ONE]
    policy.forget(ONE)
    after = send(policy, req, [make_candidate(ONE, "vllm")]).scores[ONE]
    assert after > before  # the slow observation is gone: back to the prior's prediction
