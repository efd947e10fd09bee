"""A class's ``tail`` settings in ``replay simulate``: first-token deadlines and hedges, driven
by the router's own decisions (router.control.race) on engine models in virtual time."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulator.simulate import percentile
from replay.client import Result
from replay.plan import Plan, PlanOptions
from replay.simulate.cli import main
from replay.simulate.loop import Simulation
from replay.simulate.tail import TailCounts
from replay.simulate.world import World
from replay.sources import Source
from router.config.parse import parse_config

MODEL = "deepseek-v4.1-flash"
STALL = 5.0


def _trace(path: Path, rate: float, duration: float, seed: int = 0) -> Path:
    """Poisson streamed chat at ``rate``, a distinct 40-word prompt and 32 tokens each."""
    rng, at, i, rows = random.Random(seed), 0.0, 0, []
    while at < duration:
        words = " ".join(f"w{(i * 7 + k) % 997}" for k in range(40))
        body = {
            "model": MODEL, "messages": [{"role": "user", "content": f"r{i} {words}"}],
            "max_tokens": 32, "ignore_eos": True, "stream": True,
        }  # fmt: skip
        rows.append({"custom_id": f"r-{i}", "url": "/v1/chat/completions", "body": body,
                     "t_offset_ms": at * 1e3})  # fmt: skip
        i, at = i + 1, at + rng.expovariate(rate)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _backend(name: str, stall_rate: float, seed: int, seqs: int = 4) -> dict[str, Any]:
    faults = {"faults.first_token_stall_rate": stall_rate, "faults.first_token_stall": STALL}
    emulator = {"profile": "vllm", "seed": seed, "set": {"ranks": 1, "max_num_seqs": seqs,
                                                         **faults}}  # fmt: skip
    return {"name": name, "engine": "vllm", "emulator": emulator}


def _doc(backends: list[dict[str, Any]], tail: dict[str, Any], policy: str) -> dict[str, Any]:
    names = [b["name"] for b in backends]
    doc: dict[str, Any] = {
        "backends": backends,
        "default_policy": policy,
        "policies": {
            "rr": {"type": "round-robin"},
            "in-order": {"type": "class-split", "params": {"interactive": names, "batch": names}},
        },
        "health": {"scrape_interval": 0.2},
    }
    if tail:
        doc["tail"] = {"interactive": tail}
    return doc


def _run(
    trace: Path, tail: dict[str, Any], backends: list[dict[str, Any]], policy: str = "rr"
) -> tuple[list[Result], TailCounts, float]:
    doc = _doc(backends, tail, policy)
    world = World(parse_config(doc), {})
    out: list[Result] = []
    sim = Simulation(world, world.policies[policy], policy, lambda i, r, t: out.append(r))
    end = sim.run(Plan(Source(str(trace), model=world.model()), PlanOptions()))
    return out, sim.tails.counts, end


def _p99(results: list[Result]) -> float:
    assert all(r.ok for r in results)
    return percentile([r.ttft or 0.0 for r in results], 99)


DEADLINE = {"first_token_timeout": 1.0}
HEDGE = {"hedge": {"after": 0.3, "max_fraction": 0.05}}


def test_each_defence_cuts_the_stalls_out_of_the_tail_at_a_moderate_load(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", rate=10, duration=30)
    pair = [_backend("e0", 0.02, 0), _backend("e1", 0.02, 1)]
    none, counts, _ = _run(trace, {}, pair)
    assert _p99(none) > STALL and counts == TailCounts()
    cut, counts, _ = _run(trace, DEADLINE, pair)
    assert _p99(cut) < 1.5 and len(cut) == len(none)
    assert counts.missed > 0 and counts.extra == counts.missed and counts.hedges == 0
    hedged, counts, _ = _run(trace, HEDGE, pair)
    assert _p99(hedged) < 0.6
    assert 0 < counts.hedges <= 0.05 * len(hedged) + 5  # within the budget (and its burst)
    assert counts.extra == counts.hedges and counts.cancelled == counts.hedges
    assert counts.wasted_tokens >= counts.cancelled * 40  # each loser's prompt at least
    assert counts.missed == 0


def test_nothing_is_hedged_or_failed_over_at_saturation(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", rate=30, duration=10)
    pair = [_backend("e0", 0.02, 0), _backend("e1", 0.02, 1)]
    none, _, _ = _run(trace, {}, pair)
    for tail in (DEADLINE, HEDGE):
        results, counts, _ = _run(trace, tail, pair)
        assert counts.hedges == 0 and counts.extra == 0
        assert [r.ttft for r in results] == pytest.approx([r.ttft for r in none])


def test_the_last_attempt_is_not_cut(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", rate=1, duration=3)
    results, counts, _ = _run(trace, {"first_token_timeout": 0.4}, [_backend("e0", 1.0, 0)])
    assert results and all(r.ok and r.completion_tokens == 32 for r in results)
    assert min(r.ttft or 0.0 for r in results) >= STALL  # slow but valid: never a 504
    assert counts.missed == 0 and counts.extra == 0


def test_a_hedges_loser_is_cancelled_in_its_engine(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", rate=1, duration=0.5)
    a, b = _backend("a", 1.0, 0), _backend("b", 0.0, 1)
    tail = {"hedge": {"after": 0.2, "max_fraction": 1.0}}
    results, counts, end = _run(trace, tail, [a, b], "in-order")
    assert [r.backend for r in results] == ["b"] and counts.hedges_won == 1
    assert counts.cancelled == 1
    assert end < STALL  # a's stalled sequence did not run on: its slot was freed at the win
    _, _, end = _run(trace, {}, [a, b], "in-order")
    assert end > STALL


def test_the_command_reports_what_the_defences_did(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", rate=1, duration=0.5)
    doc = _doc([_backend("a", 1.0, 0), _backend("b", 0.0, 1)], {"first_token_timeout": 0.5},
               "in-order")  # fmt: skip
    config, out = tmp_path / "router.yaml", tmp_path / "r.json"
    config.write_text(yaml.safe_dump(doc))
    assert main([str(trace), "--config", str(config), "--out", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["simulation"]["tail"] == {
        "hedges": 0, "hedges_won": 0, "cancelled": 0, "wasted_tokens": 0, "missed": 1, "extra": 1,
    }  # fmt: skip
    assert run["by_backend"].keys() == {"b"}


def test_measured_deadlines_and_hedge_delays_follow_the_winners_ttfts(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", rate=10, duration=30)
    pair = [_backend("e0", 0.02, 0), _backend("e1", 0.02, 1)]
    none, _, _ = _run(trace, {}, pair)
    auto, counts, _ = _run(trace, {"first_token_timeout": "auto", "auto_max": 2.0}, pair)
    assert _p99(auto) < 1.0 < _p99(none)  # at auto_min (0.5 s) once quick answers were measured
    assert counts.missed > 0 and counts.extra == counts.missed
    # A ceiling above the stalls: one waited out is measured, and the stalls are the P99.
    high, counts, _ = _run(trace, {"first_token_timeout": "auto", "auto_max": 10.0}, pair)
    assert _p99(high) > STALL
    # Percentile delays alike: a P95 leaves 5% behind it, which spends a 5% budget before the
    # stalls come; a P99.9 is a stall once one was waited out before 20 answers.
    for q in ("p95", "p99.9"):
        hedged, counts, _ = _run(trace, {"hedge": {"after": q, "max_fraction": 0.05}}, pair)
        assert counts.hedges > 0 and _p99(hedged) > STALL
