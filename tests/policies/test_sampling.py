"""Policies at fleet size: what each reads of 256 candidates, and where it still places.

Candidates come as the router gives them, a view of a kept set whose snapshots are taken
when read (policies/candidates.py); each backend here counts the snapshots taken of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pytest

from policies.base import Policy
from policies.candidates import Candidates, CandidateSet
from policies.prefix import prompt_blocks
from policies.registry import BackendInfo, PolicyConfigError, build_policy
from policies.testing import make_candidate, make_request
from policies.types import Candidate, Outcome, RequestClass

FLEET = 256
BACKENDS = (BackendInfo("vllm", "vllm"), BackendInfo("deepinfer", "deepinfer"))
OK = Outcome(status=200, ok=True, prompt_tokens=10, output_tokens=10, ttft_s=0.1, e2e_s=0.5)


class Replica:
    """A discovered replica whose in-flight count the test sets; counts its snapshots."""

    def __init__(self, name: str, engine: str, inflight: int = 0) -> None:
        self.name = name
        self.engine = engine
        self.inflight = inflight
        self.snapshots = 0

    def candidate(self) -> Candidate:
        self.snapshots += 1
        return make_candidate(self.name, self.engine, inflight=self.inflight)


def fleet(vllm: int = FLEET, deepinfer: int = 0) -> list[Replica]:
    return [Replica(f"vllm@10.0.{i // 250}.{i % 250}", "vllm", inflight=5) for i in range(vllm)] + [
        Replica(f"deepinfer@10.1.{i // 250}.{i % 250}", "deepinfer", inflight=5)
        for i in range(deepinfer)
    ]


def policy(kind: str, params: Mapping[str, object] | None = None) -> Policy:
    return build_policy("p", kind, dict(params or {}), BACKENDS)


SPLIT = {"interactive": ["vllm", "deepinfer"], "batch": ["deepinfer", "vllm"]}
ADAPTIVE = {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]}
CASES = [
    ("round-robin", {}, 0),
    ("least-outstanding", {}, 2),
    ("pinned", {"engine": "vllm"}, 2),
    ("class-split", SPLIT, 2),  # its first tier fills the ranking: the next is not read
    ("cache-aware", {}, 2),
    ("adaptive", ADAPTIVE, 4),
]


@pytest.mark.parametrize(("kind", "params", "most"), CASES, ids=[c[0] for c in CASES])
def test_a_request_reads_a_few_candidates_of_a_large_fleet(
    kind: str, params: Mapping[str, object], most: int
) -> None:
    replicas = fleet(FLEET // 2, FLEET // 2)
    members = CandidateSet(replicas)
    chosen = policy(kind, params)
    for i in range(50):
        before = sum(r.snapshots for r in replicas)
        decision = chosen.choose(make_request(request_id=f"r{i}"), members.view())
        assert sum(r.snapshots for r in replicas) - before <= most
        # Enough to fail over, not the whole fleet (adaptive: up to 16 per engine pool).
        assert 3 <= len(decision.ranked) <= (32 if kind == "adaptive" else 16)
        assert len(set(decision.ranked)) == len(decision.ranked)


DEPTH = [c[:2] for c in CASES if c[0] != "adaptive"]


@pytest.mark.parametrize(("kind", "params"), DEPTH, ids=[c[0] for c in DEPTH])
def test_a_sampled_ranking_holds_what_failover_walks(
    kind: str, params: Mapping[str, object]
) -> None:
    """Given the router's failover depth, a sampled ranking is that long: the names after it
    would be made for every request and tried by none."""
    members = CandidateSet(fleet(FLEET // 2, FLEET // 2))
    for depth in (3, 5):
        chosen = build_policy("p", kind, dict(params), BACKENDS, failover=depth)
        for i in range(10):
            ranked = chosen.choose(make_request(request_id=f"r{i}"), members.view()).ranked
            assert len(ranked) == len(set(ranked)) == depth


def test_up_to_sample_above_every_candidate_is_ranked() -> None:
    replicas = fleet(16)
    decision = policy("least-outstanding").choose(make_request(), CandidateSet(replicas).view())
    assert len(decision.ranked) == 16 and all(r.snapshots == 1 for r in replicas)
    never = policy("least-outstanding", {"sample_above": 0})
    assert len(never.choose(make_request(), CandidateSet(fleet()).view()).ranked) == FLEET


def test_round_robin_still_visits_every_replica_in_turn() -> None:
    members = CandidateSet(fleet())
    rr = policy("round-robin")
    heads = []
    for _ in range(FLEET):
        decision = rr.choose(make_request(), members.view())
        rr.committed(make_request(), decision, decision.ranked[0])  # the turn moves on
        heads.append(decision.ranked[0])
    assert Counter(heads) == Counter(members.names)


def test_power_of_two_choices_keeps_the_busiest_away() -> None:
    replicas = fleet()
    for r in replicas[:128]:
        r.inflight = 50  # half the fleet is swamped
    members = CandidateSet(replicas)
    lo = policy("least-outstanding")
    heads = [lo.choose(make_request(), members.view()).ranked[0] for _ in range(400)]
    swamped = {r.name for r in replicas[:128]}
    # Both draws land on the swamped half a quarter of the time; otherwise the head is free.
    assert sum(h in swamped for h in heads) < 0.35 * len(heads)


def test_class_split_keeps_its_tiers_when_sampling() -> None:
    members = CandidateSet(fleet(FLEET // 2, FLEET // 2))
    split = policy("class-split", SPLIT)
    classes: tuple[tuple[RequestClass, str], ...] = (
        ("interactive", "vllm@"),
        ("batch", "deepinfer@"),
    )
    for cls, first in classes:
        ranked = split.choose(make_request(cls), members.view()).ranked
        tiers = [name.startswith(first) for name in ranked]
        assert tiers[0] and tiers == sorted(tiers, reverse=True)  # one tier, then the next


def test_class_split_orders_a_sampled_tier_by_load() -> None:
    replicas = fleet(FLEET // 2, FLEET // 2)
    for i, r in enumerate(replicas):
        r.inflight = i % 7
    load = {r.name: r.inflight for r in replicas}
    members = CandidateSet(replicas)
    split = policy("class-split", SPLIT)
    for _ in range(50):
        ranked = split.choose(make_request(), members.view()).ranked
        first, second = ranked[:2]  # the two drawn, the less loaded first
        assert first.startswith("vllm@") and load[first] <= load[second]
    assert all(r.snapshots == 0 for r in replicas if r.engine == "deepinfer")


def test_class_split_goes_on_to_the_next_tier_in_order() -> None:
    """A first tier too small to fill the ranking is ranked whole (by load), then the next
    tier's draw: its backends come after, however idle they are."""
    busy = [Replica("vllm", "vllm", inflight=9), Replica("vllm@10.0.0.2", "vllm", inflight=1)]
    idle = [Replica(f"deepinfer@10.1.0.{i}", "deepinfer") for i in range(40)]
    split = build_policy("p", "class-split", SPLIT, BACKENDS, failover=5)
    ranked = split.choose(make_request(), CandidateSet(busy + idle).view()).ranked
    assert ranked[:2] == ("vllm@10.0.0.2", "vllm")
    assert len(ranked) == 5 and all(name.startswith("deepinfer@") for name in ranked[2:])


@pytest.mark.parametrize("kind", ["cache-aware", "adaptive"])
def test_a_warm_prompt_finds_its_backend_among_many(kind: str) -> None:
    replicas = fleet(FLEET // 2, FLEET // 2)
    members = CandidateSet(replicas)
    chosen = policy(kind, ADAPTIVE if kind == "adaptive" else {})
    req = make_request(prompt_tokens=2000, prefix_blocks=prompt_blocks("shared " * 2000))
    decision = chosen.choose(req, members.view())
    first = decision.ranked[0]
    chosen.committed(req, decision, first)
    chosen.on_finish(req, first, OK)
    heads = set()
    for _ in range(20):
        decision = chosen.choose(req, members.view())
        chosen.committed(req, decision, decision.ranked[0])
        heads.add(decision.ranked[0])
    assert heads == {first}  # sampled, yet back where the prefix is, every time


def test_plain_lists_still_work_and_sampling_is_configured_with_checks() -> None:
    cands = [make_candidate(f"vllm@{i}", "vllm", inflight=i) for i in range(40)]
    ranked = policy("least-outstanding").choose(make_request(), cands).ranked
    assert len(ranked) == 16
    with pytest.raises(PolicyConfigError, match="sample: at most sample_above"):
        policy("least-outstanding", {"sample_above": 4, "sample": 5})


def test_a_view_takes_each_snapshot_once() -> None:
    replicas = fleet(4)
    view = CandidateSet(replicas).view()
    assert isinstance(view, Candidates) and view.snapshots == 0
    assert view[1] is view[1] and view.snapshots == 1
    assert [c.name for c in view] == list(view.names)
    assert sum(r.snapshots for r in replicas) == 4
