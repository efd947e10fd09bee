"""The ``pd`` policy: two pools ranked by their own pipelines, a fallback, skipping prefill."""

from __future__ import annotations

import pytest

from policies.pd import PdPolicy, PhasePlan
from policies.registry import BackendInfo, PolicyConfigError, build_policy
from policies.testing import make_candidate as cand
from policies.testing import make_request
from policies.types import Outcome

BACKENDS = tuple(BackendInfo(n, "vllm") for n in ("p0", "p1", "d0", "d1", "c0"))
PARAMS = {"prefill": ["p0", "p1"], "decode": ["d0", "d1"], "fallback": ["c0"]}
OK = Outcome(200, True)


def pd(**params: object) -> PdPolicy:
    policy = build_policy("split", "pd", {**PARAMS, **params}, BACKENDS)
    assert isinstance(policy, PdPolicy)
    return policy


def test_each_pool_is_ranked_by_its_own_signals() -> None:
    policy = pd()
    blocks = (11, 12, 13, 14)
    req = make_request(prefix_blocks=blocks)
    cands = [
        cand("p0", prompt_tokens=5000),
        cand("p1"),
        cand("d0", inflight=3, kv=0.9),
        cand("d1", inflight=1, kv=0.2),
        cand("c0"),
    ]
    plan = policy.plan(req, cands)
    assert plan.prefill is not None and plan.prefill.ranked == ("p1", "p0")
    assert plan.decode.ranked == ("d1", "d0")
    assert plan.fallback_ranked == ("c0",) and not plan.skipped
    # prefix-aware prefill: once p0 has prefilled this prompt, it is preferred despite load
    policy.prefill_committed(req, plan, "p0")
    policy.prefilled(req, "p0", OK)
    again = policy.plan(req, cands).prefill
    assert again is not None and again.ranked[0] == "p0"
    decision = policy.choose(req, cands)
    assert decision.ranked == ("d1", "d0") and isinstance(decision.memo, PhasePlan)


def test_prefill_is_skipped_where_the_decode_engine_holds_the_prompt() -> None:
    policy = pd(skip_prefill_above=0.5)
    cands = [cand("p0"), cand("p1"), cand("d0"), cand("d1", inflight=2), cand("c0")]
    first = make_request(prefix_blocks=(1, 2, 3, 4))
    assert not policy.plan(first, cands).skipped
    policy.on_finish(first, "d0", OK)  # the first turn decoded on d0, which caches it
    turn = make_request(prefix_blocks=(1, 2, 3, 4, 5))
    plan = policy.plan(turn, cands)
    assert plan.skipped and plan.prefill is None and plan.decode.ranked[0] == "d0"
    other = make_request(prefix_blocks=(1, 2, 9, 9, 9))  # 2 of 5 blocks: below the threshold
    assert not policy.plan(other, cands).skipped
    never = pd(skip_prefill_above=None)
    never.on_finish(first, "d0", OK)
    assert not never.plan(turn, cands).skipped


def test_no_healthy_decode_engine_empties_the_plan() -> None:
    policy = pd()
    cands = [cand("p0"), cand("d0", healthy=False), cand("d1", healthy=False), cand("c0")]
    plan = policy.plan(make_request(), cands)
    assert plan.decode.ranked == () and plan.decode.empty_reason
    assert plan.fallback_ranked == ("c0",)


def test_pipelines_are_configurable_and_mistakes_reported_at_their_paths() -> None:
    policy = pd(decode_pipeline={"scorers": ["queue-depth"], "picker": "round-robin"})
    cands = [cand("p0"), cand("p1"), cand("d0"), cand("d1"), cand("c0")]
    picks = set()
    for _ in range(4):  # round-robin moves on as each choice is committed
        decision = policy.choose(make_request(), cands)
        policy.committed(make_request(), decision, decision.ranked[0])
        picks.add(decision.ranked[0])
    assert picks == {"d0", "d1"}
    with pytest.raises(PolicyConfigError) as exc:
        build_policy(
            "split",
            "pd",
            {"prefill": ["p0", "nope"], "decode": ["p0"], "prefill_pipeline": {"scorers": ["x"]},
             "skip_prefill_above": 2, "extra": 1},
            BACKENDS,
        )  # fmt: skip
    paths = {path for path, _ in exc.value.errors}
    assert {"params.prefill[1]", "params.decode", "params.skip_prefill_above"} <= paths
    assert {"params.prefill_pipeline.scorers[0].type", "params.extra"} <= paths
    with pytest.raises(PolicyConfigError, match=r"params\.decode"):
        build_policy("split", "pd", {"prefill": ["p0"]}, BACKENDS)


def test_placements_from_other_processes_reach_each_pools_record() -> None:
    """What another router process placed (router.control.placement): a prefill hop teaches
    the prefill pool's cache-aware record, a decode hop the skip's record."""
    policy = pd(skip_prefill_above=0.5)
    cands = [cand("p0"), cand("p1", inflight=2), cand("d0"), cand("d1", inflight=2), cand("c0")]
    req = make_request(prefix_blocks=(1, 2, 3, 4))
    plan = policy.plan(req, cands)
    assert plan.prefill is not None and plan.prefill.ranked[0] == "p0" and not plan.skipped
    policy.learn("p1", req.prefix_blocks)
    again = policy.plan(req, cands).prefill
    assert again is not None and again.ranked[0] == "p1"  # warm despite its load
    policy.learn("d0", req.prefix_blocks)
    skipped = policy.plan(req, cands)
    assert skipped.skipped and skipped.decode.ranked[0] == "d0"
    fresh = pd(skip_prefill_above=0.5)
    fresh.learn("c0", req.prefix_blocks)  # the fallback's: not the decode pool's record
    assert not fresh.plan(req, cands).skipped
