"""The replay CLI as a real process against real emulators over loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.fixtures import AZURE, BURSTGPT, MOONCAKE, OPENAI_BATCH
from tests.procs import Process, run_replay, start_emulator
from turnout.common.capture import CaptureRecord, dump_line, parse_line

MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def emus() -> Iterator[tuple[Process, Process]]:
    with (
        start_emulator("vllm", time_scale=50, seed=3) as a,
        start_emulator("vllm", time_scale=50, seed=3) as b,
    ):
        yield a, b


def test_azure_rows_replay_at_their_recorded_lengths(
    emus: tuple[Process, Process], tmp_path: Path
) -> None:
    out, results = tmp_path / "report.json", tmp_path / "results.jsonl"
    # 20 of the fixture's 23 rows: --max-requests cuts the trace
    args = [str(AZURE), "--target", emus[0].url, "--max-requests", "20", "--speed", "20"]
    p = run_replay(*args, "--out", str(out), "--results", str(results))
    assert p.returncode == 0, p.stderr
    assert "Successful requests" in p.stdout and "20 / 20" in p.stdout
    assert "\r" not in p.stdout  # no progress line when stdout is not a terminal
    expected = []
    for line in AZURE.read_text().splitlines()[1:21]:
        _, ctx, gen = line.split(",")
        expected.append((int(ctx), int(gen)))
    got = {}
    for raw in results.read_bytes().splitlines():
        rec = parse_line(raw)
        assert rec.resp is not None and rec.obs is not None and rec.obs.send_lag_ms is not None
        got[int(rec.custom_id.split("-")[1])] = (rec.resp.prompt_tokens, rec.resp.completion_tokens)
    assert sorted(got) == list(range(20))
    assert [got[i] for i in range(20)] == expected
    report = orjson.loads(out.read_bytes())
    assert report["format"] == "azure" and report["mode"] == "timed"
    m = report["runs"][0]["overall"]
    assert m["completed"] == 20 and m["failed"] == 0
    assert m["total_output_tokens"] == sum(g for _, g in expected)
    for key in ("mean_ttft_ms", "p95_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_e2el_ms"):
        assert m[key] is not None and m[key] > 0
    assert m["send_lag_p99_ms"] is not None


def test_batch_file_closed_loop(emus: tuple[Process, Process], tmp_path: Path) -> None:
    refused = run_replay(str(OPENAI_BATCH), "--target", emus[0].url)
    assert refused.returncode == 2 and "--concurrency" in refused.stderr
    out = tmp_path / "r.json"
    args = ["--target", emus[0].url, "--concurrency", "4", "--out", str(out)]
    p = run_replay(str(OPENAI_BATCH), *args)
    assert p.returncode == 0, p.stderr
    report = orjson.loads(out.read_bytes())
    assert report["mode"] == "closed" and report["format"] == "openai-batch"
    m = report["runs"][0]["overall"]
    assert m["completed"] == 6
    assert m["send_lag_p99_ms"] is None  # closed loop has no schedule to be late against


def test_shadow_target_compares_answers(emus: tuple[Process, Process], tmp_path: Path) -> None:
    cap = tmp_path / "cap.jsonl"
    with cap.open("wb") as f:
        for i in range(8):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Question {i}: why route?"}],
                "max_tokens": 12,
                "temperature": 0,
                "stream": i % 2 == 0,
            }
            f.write(dump_line(CaptureRecord(f"q{i}", "/v1/chat/completions", body, t_offset_ms=i)))
    out, results, shadow_results = (tmp_path / n for n in ("r.json", "p.jsonl", "s.jsonl"))
    args = ["--target", emus[0].url, "--shadow-target", emus[1].url, "--out", str(out)]
    args += ["--results", str(results), "--shadow-results", str(shadow_results)]
    p = run_replay(str(cap), *args)
    assert p.returncode == 0, p.stderr
    assert "(shadow)" in p.stdout and "Shadow agreement" in p.stdout
    shadow = orjson.loads(out.read_bytes())["runs"][0]["shadow"]
    assert shadow["target"] == emus[1].url
    assert shadow["overall"]["completed"] == 8
    ag = shadow["agreement"]
    assert ag["compared"] == 8 and ag["text_compared"] == 8
    assert ag["status"] == 1.0 and ag["output_tokens"] == 1.0
    # two emulators with the same profile and seed generate the same text
    assert ag["text"] == 1.0
    # Each target's answers in its own results file, one line per request.
    lines = {
        path.name: [parse_line(x) for x in path.read_bytes().splitlines()]
        for path in (results, shadow_results)
    }
    ids = {name: sorted(r.custom_id for r in recs) for name, recs in lines.items()}
    assert ids["p.jsonl"] == ids["s.jsonl"] == sorted(f"q{i}" for i in range(8))
    # Merged on their own, the shadow's lines give the report's shadow figures back.
    again = tmp_path / "shadow.json"
    merged = run_replay("merge", str(shadow_results), "--out", str(again))
    assert merged.returncode == 0, merged.stderr
    figures = orjson.loads(again.read_bytes())["runs"][0]["overall"]
    keys = ("completed", "mean_ttft_ms", "p99_e2el_ms", "total_output_tokens", "output_throughput")
    for key in keys:
        assert figures[key] == pytest.approx(shadow["overall"][key], rel=1e-3), key  # ms rounded
    refused = run_replay(str(cap), "--target", emus[0].url, "--shadow-results", "x.jsonl")
    assert refused.returncode == 2 and "--shadow-target" in refused.stderr


def test_dry_run_and_bad_input(tmp_path: Path) -> None:
    p = run_replay(str(MOONCAKE), "--dry-run", "--speed", "10")
    assert p.returncode == 0, p.stderr
    assert "requests    12 (skipped rows: 0)" in p.stdout and "(mooncake)" in p.stdout
    # the fixture's 5.5 s idle gap, at speed 10; the trace ends at 12.345 s
    assert "largest gap 0.550 s" in p.stdout and "duration    1.235 s" in p.stdout
    capped = run_replay(str(MOONCAKE), "--dry-run", "--speed", "10", "--max-gap", "0.5")
    assert capped.returncode == 0, capped.stderr
    # the gap is cut to 0.5 s and everything after it moves up by the 0.05 s removed
    assert "largest gap 0.500 s" in capped.stdout and "duration    1.185 s" in capped.stdout
    missing = run_replay(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "replay:" in missing.stderr
    bad = run_replay(str(MOONCAKE), "--window", "5:1")
    assert bad.returncode == 2 and "START < END" in bad.stderr


def _common(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def test_convert_writes_a_capture_with_shared_prefixes(tmp_path: Path) -> None:
    head = MOONCAKE.read_bytes().splitlines()
    n = len(head)
    cap = tmp_path / "mooncake.jsonl"
    p = run_replay("convert", str(MOONCAKE), "-o", str(cap), "--model", MODEL)
    assert p.returncode == 0, p.stderr
    assert f"wrote {n} requests (mooncake)" in p.stdout
    lines = cap.read_bytes().splitlines()
    assert len(lines) == n
    first = orjson.loads(lines[0])
    assert list(first)[:4] == ["custom_id", "method", "url", "body"]
    assert first["resp"]["usage"] == {"prompt_tokens": 1500, "completion_tokens": 6}
    words = [parse_line(line).body["messages"][0]["content"].split() for line in lines]
    hashes = [orjson.loads(line)["hash_ids"] for line in head]
    checked = 0
    for i in range(n):
        for j in range(i + 1, n):
            k = _common(hashes[i], hashes[j])
            if k and k < min(len(hashes[i]), len(hashes[j])):
                # k shared 512-token blocks: the same 512 * k leading words, then different
                assert words[i][: 512 * k] == words[j][: 512 * k]
                assert words[i][512 * k : 512 * (k + 1)] != words[j][512 * k : 512 * (k + 1)]
                checked += 1
            elif not k:
                assert words[i][:16] != words[j][:16]
    assert checked == 10  # the fixture's pairs sharing 1 to 3 leading blocks, then differing


def test_shards_split_the_trace_between_processes(
    emus: tuple[Process, Process], tmp_path: Path
) -> None:
    seen: list[set[str]] = []
    for i in range(2):
        results = tmp_path / f"shard{i}.jsonl"
        args = ["--target", emus[0].url, "--speed", "50", "--shard", f"{i}/2"]
        p = run_replay(str(BURSTGPT), *args, "--results", str(results))
        assert p.returncode == 0, p.stderr
        seen.append({parse_line(line).custom_id for line in results.read_bytes().splitlines()})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 11  # 12 rows, one with 0 response tokens
