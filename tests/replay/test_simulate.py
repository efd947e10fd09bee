"""``replay simulate`` in virtual time: its clock, its accounting and what policies see."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from policies.registry import BackendInfo
from policies.types import Candidate, Decision, Outcome, RequestInfo
from replay.client import Result
from replay.merge import merge_runs, merged_report
from replay.plan import Plan, PlanOptions
from replay.simulate.cli import main
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Source
from router.cli import default_config_path
from router.config.parse import load_document, parse_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


@dataclass
class Seen:
    """One ``choose`` call: the virtual time and the snapshots offered."""

    now: float
    candidates: tuple[Candidate, ...]


@dataclass
class Recorder:
    """A least-in-flight policy that remembers every snapshot it was given."""

    name: str
    type: str = "recorder"
    clock: Callable[[], float] = lambda: 0.0
    seen: list[Seen] = field(default_factory=list)
    finished: list[tuple[str, str, Outcome]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    """The clock at every choice and every outcome fed back, in call order."""

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        self.times.append(self.clock())
        self.seen.append(Seen(self.clock(), tuple(candidates)))
        ranked = sorted(candidates, key=lambda c: (c.inflight, c.name))
        return Decision(tuple(c.name for c in ranked))

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        pass

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        self.times.append(self.clock())
        self.finished.append((req.request_id, backend, outcome))


def recorder(name: str, params: Mapping[str, object], backends: Sequence[BackendInfo]) -> Recorder:
    """Out-of-tree factory (``tests.replay.test_simulate:recorder``)."""
    return Recorder(name)


def recorder_config(**health: Any) -> Any:
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    doc["policies"]["rec"] = {"type": "tests.replay.test_simulate:recorder"}
    doc["health"].update(health)
    return parse_config(doc)


def _run(
    config: Any, policy: str, path: Path, **plan: Any
) -> tuple[World, list[tuple[Item, Result, float]]]:
    world = World(config, {})
    pol = world.policies[policy]
    if isinstance(pol, Recorder):
        pol.clock = lambda: world.now
    out: list[tuple[Item, Result, float]] = []
    sim = Simulation(world, pol, policy, lambda i, r, t: out.append((i, r, t)))
    sim.run(Plan(Source(str(path), model=world.model()), PlanOptions(**plan)))
    return world, out


def _trace(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _busy_rows(n: int = 60) -> list[dict[str, Any]]:
    """Arrivals every 150 ms, long prompts: requests overlap, queues and KV move."""
    return [
        {"timestamp": 150 * i, "input_length": 3000 + 97 * i, "output_length": 40 + i % 50}
        for i in range(n)
    ]


def test_clock_never_goes_back_and_every_answer_ends_after_its_send(tmp_path: Path) -> None:
    world, out = _run(recorder_config(), "rec", _trace(tmp_path, _busy_rows()))
    rec = world.policies["rec"]
    assert isinstance(rec, Recorder)
    times = [s.now for s in rec.seen]
    assert times == sorted(times) and len(times) == 60
    ends = [t + (r.e2e or 0.0) for _, r, t in out]  # reported in the order they happened
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(ends))
    assert all(r.ttft is not None and 0 < r.ttft <= (r.e2e or 0) for _, r, _ in out)
    assert world.now == max(ends)


def test_every_request_is_answered_or_counted_failed(tmp_path: Path) -> None:
    rows = _busy_rows(20)
    rows.insert(5, {"timestamp": 760, "input_length": 40_000, "output_length": 10})  # > context
    rows.insert(9, {"timestamp": 1300, "input_length": 500, "output_length": 0})  # skipped row
    path = _trace(tmp_path, rows)
    _, out = _run(recorder_config(), "adaptive", path)
    ids = [i.record.custom_id for i, _, _ in out]
    assert sorted(ids) == sorted(f"mooncake-{n}" for n in range(22) if n != 9)
    failed = [r for _, r, _ in out if not r.ok]
    assert [(r.custom_id, r.status) for r in failed] == [("mooncake-5", 400)]
    ok = [r for _, r, _ in out if r.ok]
    assert all(
        r.completion_tokens == rows[int(r.custom_id.split("-")[1])]["output_length"] for r in ok
    )


def test_policy_sees_the_scrape_interval_and_staleness_it_is_configured_with(
    tmp_path: Path,
) -> None:
    world, out = _run(
        recorder_config(scrape_interval=2.0, scrape_stale_after=0.5),
        "rec",
        _trace(tmp_path, _busy_rows()),
    )
    rec = world.policies["rec"]
    assert isinstance(rec, Recorder)
    ages = []
    for s in rec.seen:
        for c in s.candidates:
            assert c.load is not None
            # scrapes at 0, 2, 4 ...: the age is the time since the last one
            assert abs(c.load.age_s - (s.now - 2.0 * math.floor(s.now / 2.0))) < 1e-6
            assert c.load.stale == (c.load.age_s > 0.5)
            ages.append(c.load.age_s)
    assert any(a > 0.5 for a in ages) and any(a <= 0.5 for a in ages)
    # the router's own in-flight count: requests sent to the backend and not yet answered
    spans = [(t, t + (r.e2e or 0.0), r.backend) for _, r, t in out]
    for s in rec.seen:
        for c in s.candidates:
            open_ = sum(1 for a, b, name in spans if name == c.name and a < s.now < b)
            assert c.inflight == open_


def test_no_scraping_means_no_load_and_feedback_reaches_the_policy(tmp_path: Path) -> None:
    world, out = _run(
        recorder_config(scrape_metrics=False), "rec", _trace(tmp_path, _busy_rows(10))
    )
    rec = world.policies["rec"]
    assert isinstance(rec, Recorder)
    assert all(c.load is None for s in rec.seen for c in s.candidates)
    assert sorted(i for i, _, _ in rec.finished) == sorted(r.custom_id for _, r, _ in out)
    assert all(o.ok and o.ttft_s is not None for _, _, o in rec.finished)


def test_command_writes_the_replay_report_marked_simulated(tmp_path: Path) -> None:
    out, results, page = tmp_path / "r.json", tmp_path / "res.jsonl", tmp_path / "r.html"
    code = main(
        [
            str(FIXTURES / "mooncake.jsonl"),
            "--policy",
            "class-split",
            "--policy",
            "round-robin",
            "--out",
            str(out),
            "--results",
            str(results),
            "--html",
            str(page),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["simulated"] is True
    assert [r["policy"] for r in report["runs"]] == ["class-split", "round-robin"]
    for run in report["runs"]:
        assert run["overall"]["completed"] + run["overall"]["failed"] == 12
        assert run["simulation"]["virtual_seconds"] > 0
    rr = report["runs"][1]["by_backend"]
    assert set(rr) == {"vllm", "deepinfer"}  # round-robin used both
    lines = results.read_text().splitlines()
    assert len(lines) == 24
    assert "Simulated in virtual time" in page.read_text()
    assert yaml.safe_load(lines[0])["route"]["policy"] == "class-split"


def test_time_window_shards_merge_into_the_whole_trace(tmp_path: Path) -> None:
    trace = _trace(tmp_path, _busy_rows(40))
    parts = []
    for i in range(3):
        res = tmp_path / f"res-{i}.jsonl"
        argv = [str(trace), "--policy", "round-robin", "--time-shard", f"{i}/3"]
        assert main([*argv, "--results", str(res)]) == 0
        parts.append([json.loads(line) for line in res.read_text().splitlines()])
    sent = [[line["t_offset_ms"] for line in part] for part in parts]
    span = 39 * 150.0  # ms, first to last arrival
    for i, offsets in enumerate(sent):  # each shard its own third of the schedule, on one base
        assert offsets and all(
            i * span / 3 - 1e-6 <= t < (i + 1) * span / 3 + 1e-6 for t in offsets
        )
    ids = sorted(line["custom_id"] for part in parts for line in part)
    assert ids == sorted(f"mooncake-{n}" for n in range(40))
    paths = [str(tmp_path / f"res-{i}.jsonl") for i in range(3)]
    report = merged_report(paths, merge_runs(paths), {})
    (run,) = report["runs"]
    assert run["overall"]["completed"] == 40
    assert run["overall"]["duration"] > span / 1000.0


def test_sweep_settings_are_validated_as_the_router_validates_itsrecorder_config(
    tmp_path: Path,
) -> None:
    trace = str(FIXTURES / "mooncake.jsonl")
    assert main([trace, "--set", "health.scrape_interval=-1"]) == 2
    assert main([trace, "--set", "policies.adaptive.params.no_such_key=1"]) == 2
    assert main([trace, "--set", "backends[9].max_inflight=1"]) == 2
    assert main([trace, "--set", "not a path=1"]) == 2
    out = tmp_path / "r.json"
    assert (
        main(
            [
                trace,
                "--policy",
                "least-outstanding",
                "--set",
                "backends[0].max_inflight=1,64",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    runs = json.loads(out.read_text())["runs"]
    # labels name a key by its last part; the setting names it whole
    assert [r["policy"] for r in runs] == [
        "least-outstanding [max_inflight=1]",
        "least-outstanding [max_inflight=64]",
    ]
    assert [r["simulation"]["setting"] for r in runs] == [
        {"backends[0].max_inflight": 1},
        {"backends[0].max_inflight": 64},
    ]


def test_responses_and_batch_lines(tmp_path: Path) -> None:
    model = World(recorder_config(), {}).model()
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/responses",
        "v": 1,
        "t_offset_ms": 0,
        "body": {"model": model, "input": "how deep is the lake?", "stream": True},
    }
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps(line) + "\n")
    out = tmp_path / "r.json"
    assert main([str(path), "--policy", "round-robin", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["runs"][0]["overall"]["completed"] == 1
    batch = FIXTURES / "openai-batch.jsonl"
    assert main([str(batch), "--policy", "round-robin"]) == 2  # no times: --rate needed
    assert main([str(batch), "--policy", "round-robin", "--rate", "2", "--out", str(out)]) == 0
    overall = json.loads(out.read_text())["runs"][0]["overall"]
    assert overall["completed"] + overall["failed"] == 6


def test_real_engines_are_simulated_by_the_profile_named_for_them(tmp_path: Path) -> None:
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    for b in doc["backends"]:
        del b["emulator"]
        b["url"] = "http://10.0.0.1:8000"  # a real engine: never contacted
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump(doc))
    trace = str(FIXTURES / "mooncake.jsonl")
    assert main([trace, "--config", str(config)]) == 2  # which engine model? not said
    out = tmp_path / "r.json"
    argv = [trace, "--config", str(config), "--policy", "round-robin", "--out", str(out)]
    argv += ["--profile", "vllm=vllm", "--profile", "deepinfer=deepinfer"]
    assert main(argv) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["overall"]["completed"] == 12
    assert set(run["by_backend"]) == {"vllm", "deepinfer"}
