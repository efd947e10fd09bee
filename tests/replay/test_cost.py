"""Busy time per backend, its price split among the classes, and what cache hits saved."""

from __future__ import annotations

import random

import pytest

from replay.client import Result
from replay.cost import MAX_STRETCHES, Backends, Busy, price


def _ok(backend: str, cls: str, ttft: float, e2e: float, **kw: object) -> Result:
    base: dict[str, object] = {
        "custom_id": "x",
        "request_class": cls,
        "status": 200,
        "stream": True,
        "lag": 0.0,
        "backend": backend,
        "ttft": ttft,
        "e2e": e2e,
        "prompt_tokens": 1000,
        "completion_tokens": 100,
    }
    base.update(kw)
    return Result(**base)  # type: ignore[arg-type]


def test_busy_time_is_the_union_of_the_requests_in_flight() -> None:
    b = Busy()
    for lo, hi in ((0, 2), (1, 3), (5, 6), (2.5, 4), (10, 11), (5.5, 5.7), (9, 10)):
        b.add(lo, hi)
    assert b.seconds == pytest.approx(4 + 1 + 2)
    assert list(zip(b.starts, b.ends, strict=True)) == [(0, 4), (5, 6), (9, 11)]


def test_busy_time_stays_bounded_and_says_how_much_it_bridged() -> None:
    b = Busy()
    rng = random.Random(1)
    starts = [k * 1.0 + rng.uniform(0, 0.0001) for k in range(3 * MAX_STRETCHES)]
    rng.shuffle(starts)
    for s in starts:  # 60,000 stretches of 0.999 s, 1 ms apart, in random order
        b.add(s, s + 0.999)
    assert len(b.starts) <= MAX_STRETCHES
    exact = 3 * MAX_STRETCHES * 0.999
    assert exact < b.seconds <= exact + b.bridged_s  # a bridged gap may fill in later
    assert b.seconds < 1.01 * exact


def test_cost_is_busy_time_priced_and_split_by_time_in_flight() -> None:
    acc = Backends()
    # vllm: busy 0..4 s; interactive requests in flight 2 + 2 s, batch 4 s
    acc.add(_ok("vllm", "interactive", 0.5, 2.0, cached_tokens=400), sent=0.0)
    acc.add(_ok("vllm", "interactive", 0.5, 2.0), sent=2.0)
    acc.add(_ok("vllm", "batch", 4.0, 4.0, stream=False), sent=0.0)
    # deepinfer: two batch requests over 10..13 s
    acc.add(_ok("deepinfer", "batch", 3.0, 3.0, stream=False), sent=10.0)
    acc.add(_ok("deepinfer", "batch", 2.0, 2.0, stream=False), sent=11.0)
    acc.add(Result("x", "interactive", 429, True, 0.0, backend=None, e2e=0.01), sent=1.0)
    doc = acc.to_dict()
    assert doc["vllm"]["busy_s"] == 4.0 and doc["deepinfer"]["busy_s"] == 3.0
    assert doc["vllm"]["by_class"]["interactive"]["cached_tokens"] == 400
    assert doc["none"]["requests"] == 1 and doc["none"]["busy_s"] == 0.0

    cost = price(doc, {"vllm": 3600.0, "deepinfer": 1800.0})  # $1 and $0.5 a second
    inter, batch = cost["by_class"]["interactive"], cost["by_class"]["batch"]
    assert inter["usd"] == pytest.approx(4.0 * 0.5)  # half of vllm's time in flight
    assert batch["usd"] == pytest.approx(4.0 * 0.5 + 3.0 * 0.5)
    assert cost["usd"] == pytest.approx(5.5)
    assert inter["usd_per_1m_output"] == pytest.approx(2.0 / 200 * 1e6)
    assert cost["usd_per_1m_output"] == pytest.approx(5.5 / 500 * 1e6)
    # vllm spent 1 of its 8 in-flight seconds before first tokens of streams, on 1,600 fresh
    # prompt tokens: $4 * 1/8 / 1600 a token; 400 were cached
    assert inter["saved_usd"] == pytest.approx(400 * 4.0 / 8 / 1600)
    assert batch["saved_usd"] == 0.0
    assert cost["unpriced"] == []


def test_a_backend_without_a_price_leaves_its_classes_unpriced() -> None:
    acc = Backends()
    acc.add(_ok("vllm", "interactive", 0.5, 2.0), sent=0.0)
    acc.add(_ok("deepinfer", "batch", 3.0, 3.0), sent=0.0)
    cost = price(acc.to_dict(), {"vllm": 10.0})
    assert cost["by_class"]["interactive"]["usd"] == pytest.approx(2.0 * 10 / 3600)
    assert cost["by_class"]["batch"]["usd"] is None
    assert cost["by_class"]["batch"]["unpriced"] == ["deepinfer"]
    assert cost["usd"] is None and cost["unpriced"] == ["deepinfer"]
