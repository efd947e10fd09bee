"""``replay`` against a real router that needs an API key, over loopback: a run in which every
request failed exits 1 naming the most common reasons; a partial failure says how many and
why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.procs import Process, run_replay, start_emulator
from tests.router.harness import base_config, start_router, write_config
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
