"""Table-driven tests of every filter, scorer and picker on candidate snapshots."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies.filters import ClassMembersFilter, MembersFilter, NotSaturatedFilter
from policies.pickers import MaxScorePicker, RoundRobinPicker
from policies.scorers import LoadScorer, class_affinity
from policies.signals import (
    inflight,
    lower_is_better,
    memory_pressure,
    outstanding_tokens,
    queue_depths,
)
from policies.testing import make_candidate as cand
from policies.testing import make_request
from policies.types import Candidate

A, B, C = "a", "b", "c"


def names(cs: Sequence[Candidate]) -> list[str]:
    return [c.name for c in cs]


@pytest.mark.parametrize(
    ("flt", "cls", "cands", "expected"),
    [
        (MembersFilter(frozenset({A, C})), "interactive", [cand(A), cand(B), cand(C)], [A, C]),
        (MembersFilter(frozenset()), "interactive", [cand(A)], []),
        (
            ClassMembersFilter({"interactive": frozenset({A}), "batch": frozenset({B, C})}),
            "batch",
            [cand(A), cand(B), cand(C)],
            [B, C],
        ),
        (
            ClassMembersFilter({"interactive": frozenset({A}), "batch": frozenset({B})}),
            "interactive",
            [cand(B), cand(A)],
            [A],
        ),
        (
            NotSaturatedFilter(),
            "interactive",
            [cand(A, inflight=4, max_inflight=4), cand(B, inflight=3, max_inflight=4), cand(C)],
            [B, C],
        ),
        # all saturated: kept, so the router's admission queue decides
        (
            NotSaturatedFilter(),
            "batch",
            [cand(A, inflight=4, max_inflight=4), cand(B, inflight=9, max_inflight=2)],
            [A, B],
        ),
    ],
)
def test_filters(flt: object, cls: str, cands: list[Candidate], expected: list[str]) -> None:
    req = make_request(cls)  # type: ignore[arg-type]
    assert names(flt.filter(req, cands)) == expected  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {}),
        ({A: 3.0}, {A: 1.0}),
        ({A: 2.0, B: 2.0}, {A: 1.0, B: 1.0}),
        ({A: 0.0, B: 5.0, C: 10.0}, {A: 1.0, B: 0.5, C: 0.0}),
    ],
)
def test_lower_is_better(values: dict[str, float], expected: dict[str, float]) -> None:
    assert lower_is_better(values) == expected


@pytest.mark.parametrize(
    ("signal", "cands", "expected"),
    [
        (inflight, [cand(A, inflight=3), cand(B, inflight=0)], {A: 3, B: 0}),
        (outstanding_tokens, [cand(A, prompt_tokens=5, output_tokens=7)], {A: 12}),
        # every candidate has a fresh scrape: the engines' own waiting gauge
        (
            queue_depths,
            [cand(A, inflight=9, waiting=1), cand(B, inflight=0, waiting=4)],
            {A: 1, B: 4},
        ),
        # one has no scrape: router-side counts for all (never mix the two)
        (queue_depths, [cand(A, inflight=9, waiting=1), cand(B, inflight=2)], {A: 9, B: 2}),
        # a stale scrape is discounted the same way
        (
            queue_depths,
            [cand(A, inflight=9, waiting=1), cand(B, inflight=2, waiting=0, stale=True)],
            {A: 9, B: 2},
        ),
        # scraped, but without the figure (e.g. only kv): fallback
        (queue_depths, [cand(A, inflight=1, kv=0.5)], {A: 1}),
        (memory_pressure, [cand(A, kv=0.9, prompt_tokens=1), cand(B, kv=0.1)], {A: 0.9, B: 0.1}),
        (
            memory_pressure,
            [cand(A, kv=0.9, prompt_tokens=100), cand(B, prompt_tokens=10, output_tokens=5)],
            {A: 100, B: 15},
        ),
    ],
)
def test_signals(signal: object, cands: list[Candidate], expected: dict[str, float]) -> None:
    assert signal(cands) == expected  # type: ignore[operator]


@pytest.mark.parametrize(
    ("scorer", "cands", "expected"),
    [
        (
            LoadScorer(inflight),
            [cand(A, inflight=4), cand(B, inflight=2), cand(C)],
            {A: 0, B: 0.5, C: 1},
        ),
        (
            LoadScorer(outstanding_tokens),
            [cand(A, prompt_tokens=100), cand(B, output_tokens=300)],
            {A: 1, B: 0},
        ),
        (LoadScorer(queue_depths), [cand(A, waiting=0), cand(B, waiting=8)], {A: 1, B: 0}),
        (LoadScorer(memory_pressure), [cand(A, kv=0.2), cand(B, kv=0.6)], {A: 1, B: 0}),
    ],
)
def test_load_scorers(
    scorer: LoadScorer, cands: list[Candidate], expected: dict[str, float]
) -> None:
    assert scorer.score(make_request(), cands) == pytest.approx(expected)


def test_class_affinity_tiers() -> None:
    scorer = class_affinity({"interactive": [[A], [B, C]], "batch": [[C]]})
    cands = [cand(A), cand(B), cand(C)]
    assert scorer.score(make_request("interactive"), cands) == {A: 1.0, B: 0.5, C: 0.5}
    assert scorer.score(make_request("batch"), cands) == {A: 0.0, B: 0.0, C: 1.0}


@pytest.mark.parametrize(
    ("scored", "expected"),
    [
        ([], []),
        ([(A, 0.1), (B, 0.9), (C, 0.5)], [B, C, A]),
        ([(A, 0.5), (B, 0.5), (C, 0.7)], [C, A, B]),  # ties keep candidate order
    ],
)
def test_max_score_picker(scored: list[tuple[str, float]], expected: list[str]) -> None:
    pairs = [(cand(n), s) for n, s in scored]
    assert MaxScorePicker().pick(make_request(), pairs) == expected


def test_round_robin_picker_rotates_and_keeps_failover_order() -> None:
    picker = RoundRobinPicker()
    pairs = [(cand(n), 0.0) for n in (A, B, C)]
    req = make_request()
    assert picker.pick(req, pairs) == picker.pick(req, pairs)  # picking again changes nothing
    got = []
    for _ in range(4):
        got.append(picker.pick(req, pairs))
        picker.committed(req, [c for c, _ in pairs], got[-1][0])
    assert got == [[A, B, C], [B, C, A], [C, A, B], [A, B, C]]
    assert picker.pick(make_request(), []) == []


def test_round_robin_rotation_cut_to_a_limit_wraps_past_the_end() -> None:
    """A sampled ranking's rotation: ``limit`` names from the head on, in turn, wrapping."""
    picker = RoundRobinPicker()
    names = ("n0", "n1", "n2", "n3", "n4")
    got = []
    for _ in range(6):
        got.append(picker.rotate(names, 3))
        picker.committed(make_request(), [], got[-1][0])
    assert got == [
        ["n0", "n1", "n2"],
        ["n1", "n2", "n3"],
        ["n2", "n3", "n4"],
        ["n3", "n4", "n0"],
        ["n4", "n0", "n1"],
        ["n0", "n1", "n2"],
    ]
