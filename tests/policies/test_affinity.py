"""Bounded-load rendezvous hashing and the session-affinity scorer."""

from __future__ import annotations

from collections import Counter

import pytest

from policies.affinity import affinity_key, home
from policies.scorers import SessionAffinityScorer
from policies.testing import make_candidate, make_request

POOL = [make_candidate(f"r{i}", "vllm") for i in range(4)]


def test_key_prefers_session_over_prefix() -> None:
    assert affinity_key(make_request(session_key="s1", prefix_hash=5)) == b"s:s1"
    assert affinity_key(make_request(prefix_hash=5)) == b"p:5"
    assert affinity_key(make_request()) is None


def test_home_is_stable_and_spread() -> None:
    homes = {f"k{i}": home(f"k{i}".encode(), POOL, 1.25) for i in range(400)}
    assert homes == {k: home(k.encode(), list(reversed(POOL)), 1.25) for k in homes}
    counts = Counter(homes.values())
    assert set(counts) == {c.name for c in POOL}
    assert min(counts.values()) > 60  # 100 expected each


def test_removing_a_replica_moves_only_its_keys() -> None:
    keys = [f"k{i}".encode() for i in range(300)]
    before = {k: home(k, POOL, 1.25) for k in keys}
    after = {k: home(k, POOL[:3], 1.25) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "r3" for k in moved)


@pytest.mark.parametrize(
    ("loads", "bound", "allowed"),
    [
        ((0, 0, 0, 0), 1.0, {0}),  # idle: every replica is under the cap of 1
        ((4, 0, 0, 0), 1.0, {0}),  # cap ceil(5/4)=2: only idle replicas qualify
        ((4, 4, 4, 0), 1.0, {0}),  # cap ceil(13/4)=4: only the idle one
        ((3, 3, 3, 3), 1.25, {3}),  # balanced load: cap ceil(1.25*13/4)=5
        ((6, 1, 1, 0), 2.0, {0, 1}),  # cap ceil(2*9/4)=5: any but the loaded one
    ],
)
def test_load_bound(loads: tuple[int, ...], bound: float, allowed: set[int]) -> None:
    pool = [make_candidate(f"r{i}", "vllm", inflight=n) for i, n in enumerate(loads)]
    for i in range(50):
        name = home(f"k{i}".encode(), pool, bound)
        chosen = next(c for c in pool if c.name == name)
        assert chosen.inflight in allowed


def test_scorer_marks_one_home_per_engine_pool() -> None:
    scorer = SessionAffinityScorer(1.25)
    cands = [*POOL, make_candidate("d0", "deepinfer"), make_candidate("d1", "deepinfer")]
    scores = scorer.score(make_request(session_key="user-42"), cands)
    assert sorted(scores.values()) == [0.0] * 4 + [1.0] * 2
    assert sum(v for k, v in scores.items() if k.startswith("r")) == 1.0
    assert scorer.score(make_request(session_key="user-42"), cands) == scores
    assert set(scorer.score(make_request(), cands).values()) == {0.0}
