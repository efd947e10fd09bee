"""``replay compare``: two saved reports paired by request; the simulator's error panel."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from replay.client import Result
from replay.compare import annotate
from replay.report import RunReport
from replay.timeline import Frame
from replay.versus import combine, error_lines, main, pairs_of


def _run(name: str, scale: float, seed: int, *, aa: bool = False) -> dict[str, Any]:
    """A run of 200 requests whose TTFT is the trace's own times ``scale``, off by ~3%."""
    trace, noise = random.Random(0), random.Random(seed)
    run = RunReport(name, frame=Frame(), aa=aa)
    for k in range(200):
        ttft = trace.lognormvariate(-2, 0.4) * scale * noise.lognormvariate(0, 0.03)
        r = Result(f"r{k}", "interactive", 200, True, 0.0, backend="vllm", ttft=ttft,
                   e2e=ttft + 0.5, itls=[0.05] * 10, prompt_tokens=100,
                   completion_tokens=11)  # fmt: skip
        run.add(r, sent=k * 0.05)
    return run.to_dict()


def _save(path: Path, runs: list[dict[str, Any]], **extra: Any) -> str:
    report = annotate({"file": "trace.jsonl", "format": "capture", "runs": runs, **extra}, {})
    path.write_bytes(orjson.dumps(report))
    return str(path)


def test_runs_pair_by_name_else_one_each() -> None:
    a: list[dict[str, Any]] = [{"policy": "x"}, {"policy": "y"}, {"policy": "x (A/A)", "aa": True}]
    assert pairs_of(a, [{"policy": "y"}, {"policy": "z"}]) == [(1, 0)]
    one: list[dict[str, Any]] = [{"policy": "x"}]
    assert pairs_of(one, [{"policy": "z"}]) == [(0, 0)]
    assert pairs_of(a, [{"policy": "z"}]) == []


def test_before_and_after_with_the_first_report_s_noise_floor(tmp_path: Path) -> None:
    before = _save(
        tmp_path / "before.json", [_run("vllm", 1.0, 1), _run("vllm (A/A)", 1.0, 2, aa=True)]
    )
    after = _save(tmp_path / "after.json", [_run("vllm", 0.7, 3)])
    report = combine(before, after, resamples=300)
    assert [r["policy"] for r in report["runs"]] == [
        "before: vllm", "before: vllm (A/A)", "after: vllm",
    ]  # fmt: skip
    doc = report["comparison"]
    (cand,) = doc["candidates"]
    assert (cand["baseline"], cand["run"], cand["matched"]) == ("before: vllm", "after: vllm", 200)
    p95 = cand["groups"]["interactive"]["p95_ttft_ms"]
    assert p95["verdict"] == "better" and 0.65 < p95["ratio"] < 0.75
    assert doc["aa"]["run"] == "before: vllm (A/A)" and p95["noise"] is not None
    assert doc["lines"][0].startswith("after: vllm vs before: vllm: interactive P95 TTFT −")
    assert "simulator_error" not in report


def test_live_against_simulated_gives_the_simulator_s_error(tmp_path: Path) -> None:
    live = _save(tmp_path / "live.json", [_run("adaptive", 1.0, 1)])
    sim = _save(tmp_path / "sim.json", [_run("adaptive", 1.1, 1)], simulated=True)
    report = combine(live, sim, resamples=200)
    (panel,) = report["simulator_error"]
    assert (panel["live"], panel["simulated"]) == ("live: adaptive", "sim: adaptive")
    err = panel["groups"]["interactive"]["mean_ttft_ms"]
    assert err["error"] == pytest.approx(
        0.1, abs=1e-5
    )  # the same noise: 10% slower (to the ms's rounding)
    assert err["ci"][0] == pytest.approx(0.1, abs=1e-5)
    assert err["ci"][1] == pytest.approx(0.1, abs=1e-5)
    # reversed (the simulated report first): still simulated against live
    again = combine(sim, live, resamples=200)["simulator_error"][0]["groups"]["interactive"]
    assert again["mean_ttft_ms"]["error"] == pytest.approx(0.1, abs=1e-5)
    lines = error_lines(report["simulator_error"])
    assert lines[0] == "Simulated (sim: adaptive) against live (live: adaptive):"
    assert lines[1].startswith("  interactive TTFT: mean TTFT +10%, P50 TTFT +10%")
    assert lines[2].startswith("  interactive other: mean TPOT ")


def test_bad_reports_are_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _save(tmp_path / "good.json", [_run("a", 1.0, 1)])
    old = tmp_path / "old.json"
    old.write_bytes(orjson.dumps({"runs": [{"policy": "a", "overall": {}}]}))
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"{not json")
    other = _save(tmp_path / "other.json", [_run("b", 1.0, 1), _run("c", 1.0, 2)])
    assert main([good, str(old)]) == 2
    assert "run a has no per-request figures to pair" in capsys.readouterr().err
    assert main([good, str(junk)]) == 2
    assert "junk.json: not JSON" in capsys.readouterr().err
    assert main([other, good]) == 2
    assert "good.json has no run named as one of" in capsys.readouterr().err
    out = tmp_path / "compared.json"
    assert main([good, good, "--out", str(out), "--price", "vllm=36"]) == 0
    compared = orjson.loads(out.read_bytes())
    assert [r["policy"] for r in compared["runs"]] == ["first: a", "second: a"]
    assert compared["runs"][0]["cost"]["by_backend"]["vllm"]["usd_per_hour"] == 36.0
    assert capsys.readouterr().out.startswith("second: a vs first: a: interactive P95 TTFT no")
