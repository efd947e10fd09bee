"""Sharded replays against a real emulator merge into one report equal to the whole run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.fixtures import OPENAI_BATCH
from tests.procs import ROOT, Process, run_replay, start_emulator
from turnout.common.capture import parse_line

DEMO = ROOT / "config" / "demo-capture.jsonl"


@pytest.fixture(scope="module")
def emu() -> Iterator[Process]:
    with start_emulator("vllm", time_scale=50, seed=5) as e:
        yield e


def test_shards_merge_into_the_whole(emu: Process, tmp_path: Path) -> None:
    # a slice of the bundled mixed capture: streamed and non-streamed requests
    capture = tmp_path / "capture.jsonl"
    capture.write_bytes(b"".join(DEMO.read_bytes().splitlines(keepends=True)[:30]))
    pieces = []
    for i in range(3):
        results = tmp_path / "shards" / f"results-{i}.jsonl"  # folder created by replay
        p = run_replay(str(capture), "--target", emu.url, "--concurrency", "4", "--shard", f"{i}/3",
                   "--results", str(results))  # fmt: skip
        assert p.returncode == 0, p.stderr
        pieces.append(results)
    ids = [parse_line(line).custom_id for f in pieces for line in f.read_bytes().splitlines()]
    whole = [orjson.loads(line)["custom_id"] for line in capture.read_bytes().splitlines()]
    assert sorted(ids) == sorted(whole)  # every request in exactly one shard

    out = tmp_path / "new-folder" / "merged.json"  # output folders are created
    p = run_replay("merge", *map(str, pieces), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "Successful requests" in p.stdout
    report = orjson.loads(out.read_bytes())
    (run,) = report["runs"]
    overall = run["overall"]
    lines = [parse_line(line) for f in pieces for line in f.read_bytes().splitlines()]
    tokens = sum((rec.resp.completion_tokens or 0) for rec in lines if rec.resp)
    assert overall["completed"] + overall["failed"] == len(whole)
    assert overall["total_output_tokens"] == tokens
    # ITLs travel in the results lines, so the merged ITL figures are exact
    gaps = [g for rec in lines if rec.obs and rec.obs.itl_ms for g in rec.obs.itl_ms]
    assert gaps
    assert overall["mean_itl_ms"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-3)


def test_merge_rejects_a_file_that_is_not_results(tmp_path: Path) -> None:
    p = run_replay("merge", str(OPENAI_BATCH))
    assert p.returncode == 2
    assert "not a replay result" in p.stderr
