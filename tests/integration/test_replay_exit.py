"""``replay`` against a real router that needs an API key, and a real engine, over loopback:
what cannot succeed stops before the first request (exit 2, the reason named), and a run in
which every request failed exits 1 naming the most common reasons."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import Process, run_replay, start_emulator
from tests.router.harness import base_config, get, start_router, write_config
from turnout.common.capture import CaptureRecord, dump_line

MODEL = "deepseek-v4.1-flash"
KEY = "k-replay-exit"


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    with start_emulator("vllm", time_scale=50, seed=2) as emu:
        yield emu


@pytest.fixture(scope="module")
def router(engine: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("replay-exit")
    (tmp / "replay.key").write_text(KEY + "\n")
    doc = base_config([("vllm", "vllm", engine.url)], require_api_key=True)
    doc["api_keys"] = [{"name": "replay", "file": str(tmp / "replay.key")}]
    with start_router(write_config(tmp, doc)) as proc:
        yield proc


def _capture(path: Path, models: list[str]) -> Path:
    with path.open("wb") as f:
        for i, model in enumerate(models):
            messages = [{"role": "user", "content": f"q{i}"}]
            body = {"model": model, "messages": messages, "max_tokens": 4}
            rec = CaptureRecord(f"r{i}", "/v1/chat/completions", body, t_offset_ms=i * 20.0)
            f.write(dump_line(rec))
    return path


def _requests_seen(router: Process) -> float:
    """Every request the router's request path has finished, whatever its outcome."""
    text = get(router.url + "/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "turnout_requests_total"
    )


def test_an_unknown_policy_stops_the_replay_before_any_request(
    router: Process, tmp_path: Path
) -> None:
    cap = _capture(tmp_path / "cap.jsonl", [MODEL] * 3)
    results = tmp_path / "results.jsonl"
    before = _requests_seen(router)
    args = ["--target", router.url, "--api-key", KEY, "--results", str(results)]
    p = run_replay(str(cap), *args, "--policy", "round-robin", "--policy", "rund-robin")
    assert p.returncode == 2, p.stderr
    assert f"{router.url}: unknown policy 'rund-robin' (did you mean 'round-robin'?)" in p.stderr
    assert "known: class-split, round-robin, vllm-only" in p.stderr
    assert "Successful requests" not in p.stdout  # no run, no report
    assert not results.exists()  # nothing was opened, so nothing half-written
    assert _requests_seen(router) == before


def test_a_missing_or_refused_key_is_named_before_any_request(
    router: Process, tmp_path: Path
) -> None:
    cap = _capture(tmp_path / "cap.jsonl", [MODEL] * 3)
    before = _requests_seen(router)
    missing = run_replay(str(cap), "--target", router.url, "--policy", "round-robin")
    assert missing.returncode == 2
    assert f"{router.url} wants an API key (401" in missing.stderr
    assert "--api-key KEY" in missing.stderr
    wrong = run_replay(str(cap), "--target", router.url, "--api-key", "k-not-this-one")
    assert wrong.returncode == 2
    assert f"{router.url} refused the API key (401" in wrong.stderr
    assert "k-not-this-one" not in wrong.stderr + wrong.stdout  # no key in a message
    assert _requests_seen(router) == before


def test_known_policies_with_the_key_replay_as_asked(router: Process, tmp_path: Path) -> None:
    cap = _capture(tmp_path / "cap.jsonl", [MODEL] * 3)
    out = tmp_path / "report.json"
    args = ["--target", router.url, "--api-key", KEY, "--speed", "4", "--out", str(out)]
    p = run_replay(str(cap), *args, "--policy", "round-robin", "--policy", "vllm-only")
    assert p.returncode == 0, p.stderr
    runs = orjson.loads(out.read_bytes())["runs"]
    assert [r["policy"] for r in runs] == ["round-robin", "vllm-only"]
    for run in runs:
        assert run["overall"]["completed"] == 3 and run["failures"] == []


def test_an_unreachable_target_is_named_with_its_error(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cap = _capture(tmp_path / "cap.jsonl", [MODEL])
    results = tmp_path / "results.jsonl"
    p = run_replay(str(cap), "--target", f"http://127.0.0.1:{port}", "--results", str(results))
    assert p.returncode == 2
    assert f"replay: cannot reach http://127.0.0.1:{port}: Cannot connect to host" in p.stderr
    assert not results.exists()
    bad = run_replay(str(cap), "--target", f"127.0.0.1:{port}")
    assert bad.returncode == 2 and "expected an http:// or https:// URL" in bad.stderr


def test_a_plain_engine_has_no_policies_to_choose(engine: Process, tmp_path: Path) -> None:
    cap = _capture(tmp_path / "cap.jsonl", [MODEL] * 2)
    p = run_replay(str(cap), "--target", engine.url, "--policy", "round-robin")
    assert p.returncode == 2
    assert f"{engine.url} lists no policies (GET /turnout/policies answered 404)" in p.stderr
    assert "not a Turnout router" in p.stderr and "without --policy" in p.stderr
    plain = run_replay(str(cap), "--target", engine.url, "--speed", "4")
    assert plain.returncode == 0, plain.stderr
    assert "2 / 2" in plain.stdout


def test_a_run_in_which_every_request_failed_exits_1_naming_why(
    router: Process, tmp_path: Path
) -> None:
    cap = _capture(tmp_path / "cap.jsonl", ["nope"] * 3)
    out = tmp_path / "report.json"
    args = ["--target", router.url, "--api-key", KEY, "--speed", "4", "--out", str(out)]
    p = run_replay(str(cap), *args)
    assert p.returncode == 1, p.stderr
    assert "target: 3 of 3 requests failed" in p.stdout
    assert "3  HTTP 404 model_not_found: model 'nope' does not exist" in p.stdout
    assert "replay: every request failed" in p.stderr
    (run,) = orjson.loads(out.read_bytes())["runs"]  # the outputs are written all the same
    assert run["failures"] == [
        {"status": 404, "reason": "model_not_found: model 'nope' does not exist", "count": 3}
    ]


def test_a_partial_failure_exits_0_and_says_how_many_failed_and_why(
    router: Process, tmp_path: Path
) -> None:
    cap = _capture(tmp_path / "cap.jsonl", [MODEL, "nope", MODEL, MODEL, "nope", MODEL])
    args = ["--target", router.url, "--api-key", KEY, "--speed", "4"]
    p = run_replay(str(cap), *args, "--policy", "round-robin", "--policy", "class-split")
    assert p.returncode == 0, p.stderr
    for policy in ("round-robin", "class-split"):
        assert f"{policy}: 2 of 6 requests failed" in p.stdout
    assert p.stdout.count("2  HTTP 404 model_not_found: model 'nope' does not exist") == 2
    assert "every request failed" not in p.stderr
