"""A small trace live and simulated through the same routing core: ``replay`` against the
embedded default (the router and its two emulated engines, real processes on loopback) and
``replay simulate`` of the same slice and policies, judged by the tolerance docs/replay.md
publishes (Simulate in virtual time: fidelity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from replay.simulate.cli import main as simulate_main
from tests.procs import ROOT, run_replay
from tests.router.harness import start_router

CAPTURE = ROOT / "config" / "demo-capture.jsonl"
SLICE = ["--max-requests", "60", "--speed", "6", "--policy", "class-split", "--policy", "adaptive"]
TOLERANCE = 0.20
"""The published tolerance of this check (a slice of 60 requests: each figure's own noise
between two live runs is a few per cent; the simulator's error on the whole capture is in
docs/benchmarks.md)."""
HEADLINE = ("mean_ttft_ms", "p95_ttft_ms", "mean_tpot_ms", "output_throughput")


def _runs(path: Path) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r["overall"] for r in orjson.loads(path.read_bytes())["runs"]}


def test_simulated_figures_are_the_live_ones_within_the_published_tolerance(
    tmp_path: Path,
) -> None:
    live, simulated = tmp_path / "live.json", tmp_path / "simulated.json"
    with start_router(None, timeout=60) as router:
        p = run_replay(str(CAPTURE), *SLICE, "--target", router.url, "--out", str(live))
    assert p.returncode == 0, p.stderr
    assert simulate_main([str(CAPTURE), *SLICE, "--out", str(simulated)]) == 0
    lv, sv = _runs(live), _runs(simulated)
    errors = {
        (policy, key): sv[policy][key] / lv[policy][key] - 1
        for policy in ("class-split", "adaptive")
        for key in HEADLINE
    }
    assert all(lv[p]["completed"] == sv[p]["completed"] == 60 for p in lv)
    off = {k: f"{e:+.1%}" for k, e in errors.items() if abs(e) > TOLERANCE}
    assert not off, f"simulated against live beyond {TOLERANCE:.0%}: {off}"
